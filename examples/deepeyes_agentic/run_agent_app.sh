#!/usr/bin/env bash
# Maps relaxtrio's RELAX_ variables to the settings this openai-SDK agent already reads.
set -euo pipefail
cd "$(dirname "$0")"
export OPENAI_BASE_URL="${RELAX_BASE_URL}"
export OPENAI_API_KEY="${RELAX_SESSION_ID}"
exec python app/env_deepeyes.py --input-json "${RELAX_INPUT_JSON}" --output-json "${RELAX_OUTPUT_JSON}"
