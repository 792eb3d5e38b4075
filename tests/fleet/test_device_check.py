"""scripts/device_check.sh skips cleanly where SGLang or a GPU is missing."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts real processes

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_check.sh"


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed")
def test_device_check_skips_without_sglang(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path))
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("device_check: SKIP: SGLang is not installed")
    assert not any(tmp_path.iterdir())  # nothing was started
