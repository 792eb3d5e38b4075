#!/usr/bin/env bash
# Installs the agent CLIs that the harness examples run (examples/claude_code, codex, opencode, qwen_code)
# into a project-local npm prefix, .tools/npm (bin/ holds claude, codex, opencode, qwen). Exact pins:
# a harness update changes its requests, so the tests pin the versions they were written against.
# Safe to re-run: an installed prefix with the same versions is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${RELAXTRIO_TOOLS_PREFIX:-$PWD/.tools/npm}
PINS=(
  "@anthropic-ai/claude-code@2.1.332"
  "@openai/codex@0.171.0"
  "opencode-ai@1.18.33"
  "@qwen-code/qwen-code@0.24.4"
)
STAMP="$PREFIX/.installed"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${PINS[*]}" ]; then
  exit 0
fi
mkdir -p "$PREFIX"
# No audit/fund/update-notifier traffic; postinstall scripts stay on (the CLIs ship their
# platform binaries as optional npm dependencies and link them in postinstall).
npm install --global --prefix "$PREFIX" --no-audit --no-fund --no-update-notifier --loglevel=error \
  "${PINS[@]}"
echo "${PINS[*]}" > "$STAMP"
