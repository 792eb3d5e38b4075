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

# A Codex home of the Session's own, with one model provider: the Responses API at relaxtrio's
# URL, the Session id as bearer key (env_key), no client retries, a long stream idle timeout
# (buffered SSE: heartbeats, then the whole reply). Offline: no update check, no analytics,
# no OpenTelemetry export, no web search.
export CODEX_HOME="${RELAX_SESSION_IO_DIR}/codex"
mkdir -p "$CODEX_HOME"
cat > "$CODEX_HOME/config.toml" <<TOML
model = "policy"
model_provider = "relaxtrio"
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

# Codex's sub-agent tools come as a Responses "namespace" tool, which relaxtrio refuses with a
# 400 naming it (no projection to the model's tool format yet): train without them.
[features]
multi_agent = false

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
