#!/usr/bin/env bash
# qwen-code (`qwen`, @qwen-code/qwen-code 0.24.4, unmodified) in headless mode on a copy of a tiny
# buggy repository; the repository's test is the reward. Maps relaxtrio's RELAX_ variables to
# qwen-code's OpenAI-compatible provider, fully offline.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
QWEN="${QWEN_BIN:-$HERE/../../.tools/npm/bin/qwen}"
WORK="${RELAX_SESSION_IO_DIR}/repo"
rm -rf "$WORK" && cp -r "$HERE/repo_template" "$WORK" && cd "$WORK"
TASK="$(python -c 'import json, os; print(json.load(open(os.environ["RELAX_INPUT_JSON"]))["metadata"]["task"])')"

# Model endpoint: Chat Completions at relaxtrio's URL (qwen-code's "openai" auth type), the Session
# id as key, the policy as model.
export OPENAI_BASE_URL="${RELAX_BASE_URL%/}"
export OPENAI_API_KEY="${RELAX_SESSION_ID}"
export OPENAI_MODEL=policy
# A configuration directory of the Session's own (no user settings, nothing shared between
# Sessions); offline: no update check, no usage statistics, no telemetry.
export QWEN_HOME="${RELAX_SESSION_IO_DIR}/qwen"
export QWEN_USAGE_STATISTICS_ENABLED=false
export QWEN_TELEMETRY_ENABLED=false
# Requests may be held (the Group starting, a weight update): no request timeout, no stream idle
# or lifetime guard (relaxtrio's buffered SSE sends nothing the guards count until the reply),
# no client retries.
export QWEN_CODE_API_TIMEOUT_MS=0
export QWEN_STREAM_IDLE_TIMEOUT_MS=0
export QWEN_STREAM_MAX_LIFETIME_MS=0
mkdir -p "$QWEN_HOME"
cat > "$QWEN_HOME/settings.json" <<JSON
{
  "general": {"enableAutoUpdate": false},
  "privacy": {"usageStatisticsEnabled": false},
  "telemetry": {"enabled": false},
  "security": {"auth": {"selectedType": "openai"}},
  "model": {"name": "policy", "generationConfig": {"timeout": 0, "maxRetries": 0, "streamIdleTimeoutMs": 0}}
}
JSON

"$QWEN" --yolo --auth-type openai --model policy --output-format json \
  --max-session-turns "${QWEN_MAX_TURNS:-6}" "$TASK" </dev/null \
  > "${RELAX_SESSION_IO_DIR}/qwen_result.json" 2> "${RELAX_SESSION_IO_DIR}/qwen.log" || true

if python test_calc.py >/dev/null 2>&1; then reward=1.0; else reward=0.0; fi
printf '{"reward": %s, "metadata": {"tests_passed": %s}}\n' "$reward" \
  "$([ "$reward" = 1.0 ] && echo true || echo false)" > "${RELAX_OUTPUT_JSON}"
