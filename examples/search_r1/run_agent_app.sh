#!/usr/bin/env bash
# Maps relaxtrio's RELAX_ variables to the settings this openai-SDK agent already reads. The
# retriever is not started here (this runs once per Session): launch.sh starts it once for the run
# and passes RETRIEVER_URL with --agent-env.
set -euo pipefail
cd "$(dirname "$0")"
export OPENAI_BASE_URL="${RELAX_BASE_URL}"
export OPENAI_API_KEY="${RELAX_SESSION_ID}"
exec python agent.py --input-json "${RELAX_INPUT_JSON}" --output-json "${RELAX_OUTPUT_JSON}"
