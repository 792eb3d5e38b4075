#!/usr/bin/env bash
# Per-Session command: hands the task to the external agent server (agent_server.py, started once
# before the run, its URL in MSWEA_SERVER_URL) and waits. No model command runs in this process.
set -euo pipefail
exec python "$(dirname "$0")/submit.py"
