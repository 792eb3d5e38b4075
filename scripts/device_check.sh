#!/usr/bin/env bash
# Device check of the inference fleet on a GPU machine with SGLang installed:
# 2 SGLang servers + the gateway (smg) on SmolLM2-135M-Instruct (the PyPI model package,
# converted once as relaxtrio.models.ensure_smollm2 does), one training step of the example agent,
# then prints rollout tokens/s, the per-step weight-sync seconds and the rollout/trainer logprob
# difference. Skips (exit 0) with a message where SGLang or a GPU is missing.
#
# Usage: scripts/device_check.sh [extra `python -m relaxtrio train` flags]
# Env: PYTHON (default .venv/bin/python, else python3), OUT (default a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

if ! "$PY" -c "import sglang" >/dev/null 2>&1; then
  echo "device_check: SKIP: SGLang is not installed for $PY (pip install sglang; it needs a GPU)"
  exit 0
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "device_check: SKIP: no GPU visible (nvidia-smi lists none)"
  exit 0
fi
if ! "$PY" -c "import smg" >/dev/null 2>&1; then
  echo "device_check: SKIP: the gateway package is missing (pip install smg==1.13.0)"
  exit 0
fi

OUT=${OUT:-$(mktemp -d -t relaxtrio-device-check-XXXXXX)}
NUM_GPUS=$(nvidia-smi -L | grep -c '^GPU ')
# One GPU holds both servers; give each a share of its memory. fp32 keeps the engine's
# logprobs comparable with the fp32 trainer.
MEM_FRACTION=$([ "$NUM_GPUS" -ge 2 ] && echo 0.7 || echo 0.35)
echo "device_check: $NUM_GPUS GPU(s); run directory $OUT"
start=$(date +%s)
"$PY" -m relaxtrio train --rollout-num-engines 2 --num-rollout 1 --engine-python "$PY" \
  --sglang-mem-fraction-static "$MEM_FRACTION" --sglang-dtype float32 \
  --output-dir "$OUT" "$@"
end=$(date +%s)
"$PY" - "$OUT/metrics.jsonl" "$((end - start))" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
row = rows[-1]
tokens = (row.get("response_length_mean") or 0) * (row.get("num_samples") or 0)
print(json.dumps({
    "check": "device_fleet",
    "rollout_tokens_per_s": round(tokens / row["rollout_s"], 2) if row.get("rollout_s") else None,
    "weight_sync_s": row.get("weight_sync_s"),
    "rollout_logprob_abs_diff": row.get("rollout_logprob_abs_diff"),
    "num_samples": row.get("num_samples"),
    "dropped_groups": row.get("dropped_groups"),
    "gateway": {k: v for k, v in row.items() if k.startswith("gateway/")},
    "wall_s": int(sys.argv[2]),
}))
EOF
