#!/usr/bin/env bash
# Device check of the production backends on a GPU machine, one after the other:
#   sglang: 2 SGLang servers launched by relaxtrio (--rollout-num-engines 2) behind the gateway
#           (smg), from SGLang's own venv (--engine-python);
#   vllm:   2 vLLM servers started here from vLLM's own venv (each --gpu-memory-utilization 0.35,
#           the flags training needs), connected with --engine-url (relaxtrio routes Sessions).
# Each runs one training step of the example agent on SmolLM2-135M-Instruct (fp32), then one JSON
# line: rollout tokens/s, weight-sync seconds (write + pause + reload + continue) and the pause
# alone (weight_pause_s), and the rollout/trainer logprob difference.
#
# Each engine gets a venv of its own under $ENGINES (default .engines/device), installed with
# uv (or pip) from $SGLANG_SPEC / $VLLM_SPEC (default "sglang" / "vllm"), or is given ready:
# SGLANG_PYTHON / VLLM_PYTHON. A backend whose venv cannot be built fails the check. Where no
# GPU is visible it prints "device_check: skipped: no GPU" and exits 0 (nothing is installed).
#
# Usage: scripts/device_check.sh [sglang] [vllm]   (default both; about 10 minutes with installs)
# Env: PYTHON (relaxtrio's, default .venv/bin/python, else python3), OUT (default a temp dir),
#      STEP_TIMEOUT_S (per backend, default 240).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "device_check: skipped: no GPU (nvidia-smi lists none)"
  exit 0
fi
BACKENDS=("$@")
[ ${#BACKENDS[@]} -gt 0 ] || BACKENDS=(sglang vllm)
OUT=${OUT:-$(mktemp -d -t relaxtrio-device-check-XXXXXX)}
ENGINES=${ENGINES:-.engines/device}
STEP_TIMEOUT_S=${STEP_TIMEOUT_S:-240}
NUM_GPUS=$(nvidia-smi -L | grep -c '^GPU ')
# Both servers may share one GPU: a share of its memory each.
MEM_FRACTION=$([ "$NUM_GPUS" -ge 2 ] && echo 0.7 || echo 0.35)
MODEL=$("$PY" -c "from relaxtrio.models import ensure_smollm2; print(ensure_smollm2())")
echo "device_check: $NUM_GPUS GPU(s); backends ${BACKENDS[*]}; run directory $OUT"
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

# engine_venv NAME SPEC: prints the venv's python, building it first when missing.
engine_venv() {
  local dir="$ENGINES/$1" spec=$2
  if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c "import $1" >/dev/null 2>&1; then
    echo "device_check: installing $spec into $dir" >&2
    if command -v uv >/dev/null 2>&1; then
      uv venv -q --python 3.11 "$dir" >&2 && uv pip install -q --python "$dir/bin/python" $spec >&2 \
        || return 1
    else
      python3 -m venv "$dir" >&2 && "$dir/bin/pip" install -q $spec >&2 || return 1
    fi
  fi
  echo "$dir/bin/python"
}

# report BACKEND WALL_S: one JSON line from the step's metrics row.
report() {
  "$PY" - "$OUT/$1/metrics.jsonl" "$1" "$2" <<'EOF'
import json, sys
row = [json.loads(line) for line in open(sys.argv[1])][-1]
tokens = (row.get("response_length_mean") or 0) * (row.get("num_samples") or 0)
print(json.dumps({
    "check": "device_fleet", "backend": sys.argv[2],
    "rollout_tokens_per_s": round(tokens / row["rollout_s"], 2) if row.get("rollout_s") else None,
    "engine_gen_tokens_per_s": row.get("engine/gen_tokens_per_s"),
    "weight_sync_s": row.get("weight_sync_s"), "weight_pause_s": row.get("weight_pause_s"),
    "rollout_logprob_abs_diff": row.get("rollout_logprob_abs_diff"),
    "num_samples": row.get("num_samples"), "dropped_groups": row.get("dropped_groups"),
    "prefix_cache_hit_rate": row.get("engine/prefix_cache_hit_rate"),
    "gateway": {k: v for k, v in row.items() if k.startswith("gateway/")},
    "wall_s": int(sys.argv[3]),
}))
EOF
}

check_sglang() {
  "$PY" -c "import smg" 2>/dev/null || { echo "device_check: sglang: the gateway is missing (pip install smg)"; return 1; }
  local engine_py start=$SECONDS
  engine_py=${SGLANG_PYTHON:-$(engine_venv sglang "${SGLANG_SPEC:-sglang}")} || return 1
  timeout "$STEP_TIMEOUT_S" "$PY" -m relaxtrio train --rollout-backend sglang --rollout-num-engines 2 \
    --num-rollout 1 --engine-python "$engine_py" --sglang-mem-fraction-static "$MEM_FRACTION" \
    --sglang-dtype float32 --output-dir "$OUT/sglang" || return 1
  report sglang $((SECONDS - start))
}

# vllm_server PYTHON PORT GPU: one vLLM server in its own process group, logging to $OUT.
vllm_server() {
  CUDA_VISIBLE_DEVICES=$3 VLLM_SERVER_DEV_MODE=1 HF_HUB_OFFLINE=1 setsid "$1" \
    -m vllm.entrypoints.openai.api_server --model "$MODEL" --dtype float32 \
    --enable-prefix-caching --enable-scale-out --logprobs-mode processed_logprobs \
    --enable-prompt-tokens-details --gpu-memory-utilization "$MEM_FRACTION" \
    --host 127.0.0.1 --port "$2" >"$OUT/vllm-$2.log" 2>&1 &
  PIDS+=($!)
}

check_vllm() {
  local engine_py start=$SECONDS urls=() port
  engine_py=${VLLM_PYTHON:-$(engine_venv vllm "${VLLM_SPEC:-vllm}")} || return 1
  for i in 0 1; do
    port=$((18600 + i))
    vllm_server "$engine_py" "$port" $((i % NUM_GPUS))
    urls+=("http://127.0.0.1:$port")
  done
  for url in "${urls[@]}"; do
    timeout 300 bash -c "until curl -sf $url/health >/dev/null; do sleep 2; done" || {
      echo "device_check: vllm: $url did not become healthy; see $OUT/vllm-*.log"; return 1; }
  done
  timeout "$STEP_TIMEOUT_S" "$PY" -m relaxtrio train --rollout-backend vllm --engine-url "${urls[@]}" \
    --num-rollout 1 --output-dir "$OUT/vllm" || return 1
  report vllm $((SECONDS - start))
  cleanup; PIDS=()
}

status=0
for backend in "${BACKENDS[@]}"; do
  mkdir -p "$OUT/$backend"
  echo "device_check: $backend"
  "check_$backend" || { echo "device_check: $backend: FAILED"; status=1; }
done
exit $status
