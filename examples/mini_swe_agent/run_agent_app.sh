#!/usr/bin/env bash
# mini-swe-agent (the `mini` CLI, unmodified) on a copy of a tiny buggy repository; the repository's
# test is the reward. Maps relaxtrio's RELAX_ variables to mini-swe-agent's and litellm's settings.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="${RELAX_SESSION_IO_DIR}/repo"
rm -rf "$WORK" && cp -r "$HERE/repo_template" "$WORK" && cd "$WORK"
TASK="$(python -c 'import json, os; print(json.load(open(os.environ["RELAX_INPUT_JSON"]))["metadata"]["task"])')"

# Offline and non-interactive: no first-run setup prompt, no model-cost map download, no
# telemetry, a config directory of our own, cost tracking off (the served model has no price).
export MSWEA_CONFIGURED=true
export MSWEA_GLOBAL_CONFIG_DIR="${RELAX_SESSION_IO_DIR}/mswea"
export MSWEA_COST_TRACKING=ignore_errors
export LITELLM_LOCAL_MODEL_COST_MAP=True
export LITELLM_TELEMETRY=False
export MSWEA_SILENT_STARTUP=1

# The model endpoint: litellm's OpenAI-compatible provider ("openai/<name>") at relaxtrio's URL,
# the Session id as key, a long client timeout (requests may be held), no client retries.
mini --yolo --exit-immediately --model-class litellm_textbased \
  -c mini_textbased.yaml \
  -c model.model_name=openai/policy \
  -c "model.model_kwargs.api_base=${RELAX_BASE_URL}" \
  -c "model.model_kwargs.api_key=${RELAX_SESSION_ID}" \
  -c model.model_kwargs.timeout=3600 \
  -c model.model_kwargs.num_retries=0 \
  -c "model.model_kwargs.max_tokens=${MSWEA_MAX_TOKENS:-256}" \
  -c "agent.step_limit=${MSWEA_STEP_LIMIT:-6}" \
  -c agent.cost_limit=0 \
  -o "${RELAX_SESSION_IO_DIR}/trajectory.json" \
  -t "$TASK" </dev/null || true   # a run that hits its step limit still gets its reward

if python test_calc.py >/dev/null 2>&1; then reward=1.0; else reward=0.0; fi
python - "$reward" <<'PY'
import json, os, sys
traj = os.path.join(os.environ["RELAX_SESSION_IO_DIR"], "trajectory.json")
steps = 0
if os.path.exists(traj):
    steps = sum(1 for m in json.load(open(traj)).get("messages", []) if m.get("role") == "assistant")
json.dump({"reward": float(sys.argv[1]), "metadata": {"tests_passed": sys.argv[1] == "1.0", "steps": steps}},
          open(os.environ["RELAX_OUTPUT_JSON"], "w"))
PY
