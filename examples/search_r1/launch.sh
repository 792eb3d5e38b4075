#!/usr/bin/env bash
# Starts the retriever once for the whole run (a cross-session service, outside the per-Session
# agent command), runs `python -m relaxtrio <train|rollout> ...` with its URL passed to every agent,
# and stops the retriever when the run ends. Usage: bash examples/search_r1/launch.sh train [flags...]
# (run from the repository root; RETRIEVER_PORT picks the port, default 8000).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
LOG="$(mktemp)"
python "$HERE/retriever.py" --port "${RETRIEVER_PORT:-8000}" >"$LOG" 2>&1 &
RETRIEVER_PID=$!
trap 'kill "$RETRIEVER_PID" 2>/dev/null || true; wait "$RETRIEVER_PID" 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 100); do  # the index is built at start-up: wait for the listening line
  URL="$(sed -n 's/^retriever listening on //p' "$LOG")"
  [ -n "$URL" ] && break
  kill -0 "$RETRIEVER_PID" 2>/dev/null || { cat "$LOG" >&2; exit 1; }
  sleep 0.2
done
[ -n "$URL" ] || { echo "launch.sh: the retriever did not start" >&2; cat "$LOG" >&2; exit 1; }
# The agents' settings go with --agent-env (given last, so do not pass --agent-env yourself: set
# SEARCH_R1_MODE, SEARCH_R1_MAX_TURNS, SEARCH_R1_TOPK or SEARCH_R1_MAX_TOKENS in the environment).
AGENT_ENV=("RETRIEVER_URL=$URL")
for name in SEARCH_R1_MODE SEARCH_R1_MAX_TURNS SEARCH_R1_TOPK SEARCH_R1_MAX_TOKENS; do
  if [ -n "${!name:-}" ]; then AGENT_ENV+=("$name=${!name}"); fi
done
python -m relaxtrio "$@" --agent-cwd "$HERE" --agent-command "bash run_agent_app.sh" --agent-env "${AGENT_ENV[@]}"
