#!/usr/bin/env bash
# Runs the checkers CI runs: ruff (rules in pyproject.toml's [tool.ruff]) over the package, the tests
# and the benchmarks, and mypy ([tool.mypy]: strict on forest, nursery, api and fleet; the rest at the
# level set there). Installs the `lint` extra's pinned ruff and mypy into the venv when missing.
# Exits non-zero if either checker finds anything; both always run.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -m ruff --version >/dev/null 2>&1 || ! "$PY" -m mypy --version >/dev/null 2>&1; then
  "$PY" -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[lint]" || exit 1
fi
status=0
echo "== ruff check"
"$PY" -m ruff check relaxtrio tests benchmarks || status=1
echo "== mypy"
"$PY" -m mypy || status=1
exit $status
