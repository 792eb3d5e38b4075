"""relaxtrio.forest stays at the bottom of the package graph: stdlib, attrs, and relaxtrio's two
shared leaf modules (``_errors``, the error hierarchy, and ``_validate``, the validation vocabulary),
which themselves import nothing but the stdlib and attrs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import relaxtrio.forest

pytestmark = pytest.mark.slow  # starts real processes

_PROBE = """
import json, sys
before = set(sys.modules)
import {module}
print(json.dumps(sorted(set(sys.modules) - before)))
"""

ALLOWED_THIRD_PARTY = {"attr", "attrs"}
SHARED_LEAVES = {"relaxtrio._errors", "relaxtrio._validate"}


def _loaded_by(module: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module)], capture_output=True, text=True,
        timeout=60, check=True,
    )
    return json.loads(done.stdout)


def test_forest_imports_only_stdlib_attrs_and_errors() -> None:
    """Stricter than tests/test_layering.py: nothing outside the stdlib but attrs may load."""
    loaded = _loaded_by("relaxtrio.forest")
    foreign = sorted(
        name
        for name in loaded
        if name.split(".")[0] not in sys.stdlib_module_names | ALLOWED_THIRD_PARTY | {"relaxtrio"}
    )
    assert not foreign, foreign
    ours = {name for name in loaded if name.startswith("relaxtrio.")}
    assert all(name in SHARED_LEAVES or name.startswith("relaxtrio.forest") for name in ours), sorted(
        ours
    )


@pytest.mark.parametrize("module", sorted(SHARED_LEAVES))
def test_shared_leaf_modules_import_only_stdlib_attrs_and_errors(module: str) -> None:
    loaded = _loaded_by(module)
    foreign = sorted(
        name
        for name in loaded
        if name.split(".")[0] not in sys.stdlib_module_names | ALLOWED_THIRD_PARTY | {"relaxtrio"}
    )
    assert not foreign, foreign
    ours = {name for name in loaded if name.startswith("relaxtrio.")}
    assert ours <= {module, "relaxtrio._errors"}, sorted(ours)


def test_public_names_are_exported_explicitly() -> None:
    expected = {
        "Conversation",
        "SessionForest",
        "Match",
        "RootNode",
        "ObservationNode",
        "ResponseNode",
        "WeightSpan",
        "TrainingSample",
        "SessionOutput",
        "ExportRecord",
        "parse_session_output",
        "export_samples",
        "state_hash",
    }
    assert expected <= set(relaxtrio.forest.__all__)
    submodules = [m for n, m in sys.modules.items() if n.startswith("relaxtrio.forest.")]
    for name in relaxtrio.forest.__all__:
        obj = getattr(relaxtrio.forest, name)
        if isinstance(obj, str):  # a constant (TRACE_KEY): defined by one of the submodules
            assert any(getattr(m, name, None) is obj for m in submodules), name
        else:
            assert obj.__module__.startswith("relaxtrio.forest"), name
