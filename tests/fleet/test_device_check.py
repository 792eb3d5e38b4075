"""scripts/device_check.sh skips cleanly where no GPU is visible (it runs on a GPU machine)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts real processes

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_check.sh"


def _gpu_visible() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return any(line.startswith("GPU ") for line in listed.stdout.splitlines())


@pytest.mark.skipif(_gpu_visible(), reason="a GPU is visible: the check would run")
def test_device_check_skips_without_a_gpu(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "out"),
               ENGINES=str(tmp_path / "engines"))
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "device_check: skipped: no GPU (nvidia-smi lists none)\n"
    assert not any(tmp_path.iterdir())  # nothing was installed or started
