"""The turn handler sees a Session only through the turn protocol (relaxtrio.nursery.turns)."""

from __future__ import annotations

import ast
from pathlib import Path

import relaxtrio

PACKAGE_DIR = Path(relaxtrio.__file__).resolve().parent


def _nursery_imports(path: Path) -> set[str]:
    """The relaxtrio.nursery modules ``path`` (a module of relaxtrio/rollout) imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 2 and module.startswith("nursery"):
                found.add("relaxtrio." + module)
            elif module.startswith("relaxtrio.nursery"):
                found.add(module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("relaxtrio.nursery"))
    return found


def test_the_turn_handler_imports_only_the_turn_protocol_of_the_nursery() -> None:
    assert _nursery_imports(PACKAGE_DIR / "rollout" / "turns.py") == {"relaxtrio.nursery.turns"}


def test_the_turn_protocol_names_no_session() -> None:
    """Every parameter of the protocol is a value of the turn (no Session object crosses)."""
    tree = ast.parse((PACKAGE_DIR / "nursery" / "turns.py").read_text(encoding="utf-8"))
    annotations = [ast.unparse(node.annotation) for node in ast.walk(tree)
                   if isinstance(node, ast.arg) and node.annotation is not None]
    assert annotations and not [a for a in annotations if "Session" in a.replace("SessionForest", "")]
