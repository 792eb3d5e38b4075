#!/usr/bin/env bash
# opencode (`opencode run`, opencode-ai 1.18.33, unmodified) on a copy of a tiny buggy repository;
# the repository's test is the reward. Maps relaxtrio's RELAX_ variables to an OpenAI-compatible
# opencode provider, fully offline.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OPENCODE="${OPENCODE_BIN:-$HERE/../../.tools/npm/bin/opencode}"
WORK="${RELAX_SESSION_IO_DIR}/repo"
rm -rf "$WORK" && cp -r "$HERE/repo_template" "$WORK" && cd "$WORK"
TASK="$(python -c 'import json, os; print(json.load(open(os.environ["RELAX_INPUT_JSON"]))["metadata"]["task"])')"

# State, cache and config of the Session's own (XDG dirs), so Sessions share nothing.
export XDG_CONFIG_HOME="${RELAX_SESSION_IO_DIR}/xdg/config"
export XDG_DATA_HOME="${RELAX_SESSION_IO_DIR}/xdg/data"
export XDG_CACHE_HOME="${RELAX_SESSION_IO_DIR}/xdg/cache"
export XDG_STATE_HOME="${RELAX_SESSION_IO_DIR}/xdg/state"
# Offline: no auto-update, no models.dev catalogue fetch, no default plugins, no LSP downloads.
export OPENCODE_DISABLE_AUTOUPDATE=1
export OPENCODE_DISABLE_MODELS_FETCH=1
export OPENCODE_DISABLE_DEFAULT_PLUGINS=1
export OPENCODE_DISABLE_LSP_DOWNLOAD=1
export OPENCODE_DISABLE_SHARE=1
export OPENCODE_DISABLE_CLAUDE_CODE=1
# One provider: Chat Completions at relaxtrio's URL through @ai-sdk/openai-compatible (bundled),
# the Session id as key, a long timeout, and the same model for the small (title) model; its
# limits are the policy's window and turn limit (docs/agent-contract.md#environment-variables),
# from which opencode sizes its requests and decides when to compact.
export OPENCODE_CONFIG_CONTENT="$(cat <<JSON
{
  "\$schema": "https://opencode.ai/config.json",
  "autoupdate": false,
  "share": "disabled",
  "model": "relaxtrio/policy",
  "small_model": "relaxtrio/policy",
  "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
  "provider": {
    "relaxtrio": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "relaxtrio",
      "options": {"baseURL": "${RELAX_BASE_URL%/}", "apiKey": "${RELAX_SESSION_ID}", "timeout": 3600000},
      "models": {"policy": {"name": "policy", "tool_call": true, "limit": {"context": ${RELAX_MAX_CONTEXT_TOKENS:-32768}, "output": ${RELAX_MAX_RESPONSE_TOKENS:-4096}}}}
    }
  }
}
JSON
)"

"$OPENCODE" run --pure --print-logs --log-level WARN "$TASK" </dev/null \
  > "${RELAX_SESSION_IO_DIR}/opencode.log" 2>&1 || true

if python test_calc.py >/dev/null 2>&1; then reward=1.0; else reward=0.0; fi
printf '{"reward": %s, "metadata": {"tests_passed": %s}}\n' "$reward" \
  "$([ "$reward" = 1.0 ] && echo true || echo false)" > "${RELAX_OUTPUT_JSON}"
