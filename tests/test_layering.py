"""The dependency arrows point one way (DESIGN.md): checked by importing each package alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("trio", "quart", "quart_trio", "hypercorn", "httpx", "torch", "transformers")

FORBIDDEN = {
    "relaxtrio.forest": HEAVY,
    "relaxtrio.nursery": ("quart", "quart_trio", "hypercorn", "httpx", "torch", "transformers",
                          "relaxtrio.engine", "relaxtrio.api", "relaxtrio.rollout", "relaxtrio.train"),
    "relaxtrio.api": ("torch", "transformers", "relaxtrio.engine", "relaxtrio.rollout",
                      "relaxtrio.train"),
    "relaxtrio.engine.client": ("torch", "quart", "quart_trio", "relaxtrio.nursery", "relaxtrio.api",
                                "relaxtrio.rollout", "relaxtrio.train"),
    "relaxtrio.train": ("trio", "quart", "httpx", "relaxtrio.nursery", "relaxtrio.api",
                        "relaxtrio.rollout", "relaxtrio.engine"),
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_it_may(package: str) -> None:
    code = f"import {package}, sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    bad = sorted(m for m in FORBIDDEN[package] if m in loaded)
    assert not bad, f"{package} pulls in {bad}"
