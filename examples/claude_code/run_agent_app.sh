#!/usr/bin/env bash
# Claude Code (`claude -p`, @anthropic-ai/claude-code 2.1.332, unmodified) on a copy of a tiny buggy
# repository; the repository's test is the reward. Maps relaxtrio's RELAX_ variables to Claude
# Code's settings, fully offline.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CLAUDE="${CLAUDE_BIN:-$HERE/../../.tools/npm/bin/claude}"
WORK="${RELAX_SESSION_IO_DIR}/repo"
rm -rf "$WORK" && cp -r "$HERE/repo_template" "$WORK" && cd "$WORK"
TASK="$(python -c 'import json, os; print(json.load(open(os.environ["RELAX_INPUT_JSON"]))["metadata"]["task"])')"

# Model endpoint: Anthropic Messages at relaxtrio's URL, the Session id as key; every model role
# (main, small/fast background calls) is the policy; a long client timeout (requests may be held
# while the Group starts or weights update) and no client retries.
export ANTHROPIC_BASE_URL="${RELAX_BASE_URL}"
export ANTHROPIC_API_KEY="${RELAX_SESSION_ID}"
export ANTHROPIC_MODEL=policy
export ANTHROPIC_SMALL_FAST_MODEL=policy
export ANTHROPIC_DEFAULT_HAIKU_MODEL=policy
export ANTHROPIC_DEFAULT_SONNET_MODEL=policy
export ANTHROPIC_DEFAULT_OPUS_MODEL=policy
export API_TIMEOUT_MS=3600000
export CLAUDE_CODE_MAX_RETRIES=0
# Tool search off: relaxtrio refuses deferred tools (`defer_loading`) with a 400 naming this
# variable, so that the policy never trains on a prompt whose tools change behind its back.
export ENABLE_TOOL_SEARCH="${ENABLE_TOOL_SEARCH:-false}"
# Offline: no telemetry, error reports, update checks or other non-essential traffic; a config
# directory of the Session's own (no user settings, no shared state between Sessions).
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1
export DISABLE_TELEMETRY=1
export DISABLE_ERROR_REPORTING=1
export DISABLE_AUTOUPDATER=1
export DISABLE_BUG_COMMAND=1
export DISABLE_COST_WARNINGS=1
export CLAUDE_CODE_DISABLE_TERMINAL_TITLE=1
export CLAUDE_CONFIG_DIR="${RELAX_SESSION_IO_DIR}/claude"
export IS_SANDBOX=1   # the Session's directory is the sandbox: lets root skip permission prompts

"$CLAUDE" -p "$TASK" --output-format json --max-turns "${CLAUDE_MAX_TURNS:-6}" \
  --dangerously-skip-permissions > "${RELAX_SESSION_IO_DIR}/claude_result.json" </dev/null || true

if python test_calc.py >/dev/null 2>&1; then reward=1.0; else reward=0.0; fi
printf '{"reward": %s, "metadata": {"tests_passed": %s}}\n' "$reward" \
  "$([ "$reward" = 1.0 ] && echo true || echo false)" > "${RELAX_OUTPUT_JSON}"
