#!/usr/bin/env bash
# Codex (`codex exec`, @openai/codex 0.171.0, unmodified) on a copy of a tiny buggy repository; the
# repository's test is the reward. Maps relaxtrio's RELAX_ variables to a Codex model provider,
# fully offline.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CODEX="${CODEX_BIN:-$HERE/../../.tools/npm/bin/codex}"
WORK="${RELAX_SESSION_IO_DIR}/repo"
rm -rf "$WORK" && cp -r "$HERE/repo_template" "$WORK" && cd "$WORK"
TASK="$(python -c 'import json, os; print(json.load(open(os.environ["RELAX_INPUT_JSON"]))["metadata"]["task"])')"

# A Codex home of the Session's own, with one model provider of its own (not the built-in openai
# one, which would compact through POST /responses/compact, refused by relaxtrio: with its own
# provider Codex compacts locally, the policy writing the summary): the Responses API at relaxtrio's
# URL, the Session id as bearer key (env_key), no client retries, a long stream idle timeout
# (buffered SSE: heartbeats, then the whole reply). Offline: no update check, no analytics,
# no OpenTelemetry export, no web search.
export CODEX_HOME="${RELAX_SESSION_IO_DIR}/codex"
mkdir -p "$CODEX_HOME"
# The policy's window and turn limit (docs/agent-contract.md#environment-variables): Codex compacts
# the conversation (locally, with a summary request of its own) once it passes the limit below,
# which leaves room for a whole reply and the summary.
WINDOW="${RELAX_MAX_CONTEXT_TOKENS:-32768}"
REPLY="${RELAX_MAX_RESPONSE_TOKENS:-4096}"
COMPACT_AT=$(( (WINDOW - REPLY) * 8 / 10 ))
cat > "$CODEX_HOME/config.toml" <<TOML
model = "policy"
model_provider = "relaxtrio"
model_context_window = ${WINDOW}
model_auto_compact_token_limit = ${COMPACT_AT}
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.relaxtrio]
name = "relaxtrio"
base_url = "${RELAX_BASE_URL%/}"
env_key = "RELAX_SESSION_ID"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 3600000

[analytics]
enabled = false

[otel]
exporter = "none"
TOML

"$CODEX" exec --skip-git-repo-check --ephemeral --color never \
  -o "${RELAX_SESSION_IO_DIR}/codex_last_message.txt" "$TASK" </dev/null \
  > "${RELAX_SESSION_IO_DIR}/codex.log" 2>&1 || true

if python test_calc.py >/dev/null 2>&1; then reward=1.0; else reward=0.0; fi
printf '{"reward": %s, "metadata": {"tests_passed": %s}}\n' "$reward" \
  "$([ "$reward" = 1.0 ] && echo true || echo false)" > "${RELAX_OUTPUT_JSON}"
