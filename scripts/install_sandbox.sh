#!/usr/bin/env bash
# Installs bubblewrap (the `bwrap` sandbox of examples/mini_swe_agent, Debian package `bubblewrap`)
# when it is missing. The example's agent server runs every shell command of the model under
# `bwrap --unshare-all`; its tests skip without it, so CI installs it first to run them.
# Safe to re-run: nothing happens when bwrap is already on PATH.
set -euo pipefail
if command -v bwrap >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  SUDO="sudo"
fi
$SUDO apt-get install -y bubblewrap || { $SUDO apt-get update && $SUDO apt-get install -y bubblewrap; }
bwrap --version
