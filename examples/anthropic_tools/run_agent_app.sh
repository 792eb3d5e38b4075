#!/usr/bin/env bash
# Maps relaxtrio's RELAX_ variables to the settings the anthropic SDK already reads.
set -euo pipefail
cd "$(dirname "$0")"
export ANTHROPIC_BASE_URL="${RELAX_BASE_URL}"
export ANTHROPIC_API_KEY="${RELAX_SESSION_ID}"
exec python agent.py --input-json "${RELAX_INPUT_JSON}" --output-json "${RELAX_OUTPUT_JSON}"
