"""relaxtrio.forest stays at the bottom of the package graph: stdlib, attrs and relaxtrio._errors only."""

from __future__ import annotations

import json
import subprocess
import sys

import relaxtrio.forest

_PROBE = """
import json, sys
before = set(sys.modules)
import relaxtrio.forest
print(json.dumps(sorted(set(sys.modules) - before)))
"""

ALLOWED_THIRD_PARTY = {"attr", "attrs"}


def test_forest_imports_only_stdlib_attrs_and_errors() -> None:
    """Stricter than tests/test_layering.py: nothing outside the stdlib but attrs may load."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = json.loads(done.stdout)
    foreign = sorted(
        name
        for name in loaded
        if name.split(".")[0] not in sys.stdlib_module_names | ALLOWED_THIRD_PARTY | {"relaxtrio"}
    )
    assert not foreign, foreign
    ours = {name for name in loaded if name.startswith("relaxtrio.")}
    assert all(name == "relaxtrio._errors" or name.startswith("relaxtrio.forest") for name in ours), sorted(
        ours
    )


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
    for name in relaxtrio.forest.__all__:
        assert getattr(relaxtrio.forest, name).__module__.startswith("relaxtrio.forest")
