"""The dependency arrows point one way (docs/architecture.md): one row per package, plus no cycles.

Three checks:

* each package, imported alone in a fresh interpreter, loads none of the modules its row forbids
  (what a user pays for ``import relaxtrio.forest`` is exactly what that package needs);
* the static import graph of every relaxtrio module has no cycle, counting imports under
  ``TYPE_CHECKING`` and imports inside functions: a cycle hidden that way is still two modules that
  cannot be understood apart;
* the package map in docs/architecture.md#packages has one row per package and loose module, and
  each row's "may import" names exactly the relaxtrio packages that its code imports (the same
  static graph), none of them one that ``FORBIDDEN`` bans: the page cannot drift from the code,
  and a new arrow between packages is a reviewed change to that page.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import relaxtrio

PACKAGE_DIR = Path(relaxtrio.__file__).resolve().parent
ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
WEB = ("quart", "quart_trio", "hypercorn")
HEAVY = ("trio", *WEB, "httpx", "torch", "transformers")
UPPER = ("relaxtrio.api", "relaxtrio.rollout", "relaxtrio.train", "relaxtrio.run.driver", "relaxtrio.cli.main",
         "relaxtrio.tools.serve", "relaxtrio.tools.replay", "relaxtrio.tools.doctor", "relaxtrio.run.trackers")

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "relaxtrio.forest": (*HEAVY, "relaxtrio.nursery", "relaxtrio.chat", "relaxtrio.sglang"),
    "relaxtrio.config": (*HEAVY, "relaxtrio.forest", "relaxtrio.nursery", *UPPER),
    "relaxtrio.media": ("trio", *WEB, "httpx", "torch", "relaxtrio.forest", "relaxtrio.nursery",
                        "relaxtrio.chat", "relaxtrio.sglang", *UPPER),
    "relaxtrio.chat": ("trio", *WEB, "httpx", "torch", "relaxtrio.nursery", "relaxtrio.sglang",
                       "relaxtrio.engine", *UPPER),
    "relaxtrio.sglang": ("torch", "transformers", *WEB, "relaxtrio.nursery", "relaxtrio.chat",
                         "relaxtrio.engine", *UPPER),
    "relaxtrio.vllm": ("torch", "transformers", "vllm", *WEB, "relaxtrio.nursery", "relaxtrio.chat",
                       "relaxtrio.engine", "relaxtrio.fleet", *UPPER),
    "relaxtrio.vllm.client": ("torch", "transformers", "vllm", *WEB, "relaxtrio.nursery", "relaxtrio.chat",
                              "relaxtrio.engine", "relaxtrio.fleet", *UPPER),
    "relaxtrio.models": (*HEAVY, "relaxtrio.forest", "relaxtrio.nursery", "relaxtrio.chat",
                         "relaxtrio.sglang", "relaxtrio.engine", *UPPER),
    "relaxtrio.nursery": (*WEB, "httpx", "torch", "transformers", "relaxtrio.chat",
                          "relaxtrio.sglang", "relaxtrio.engine", *UPPER),
    "relaxtrio.api": ("torch", "transformers", "httpx", "relaxtrio.chat", "relaxtrio.sglang",
                      "relaxtrio.engine", "relaxtrio.rollout", "relaxtrio.train", "relaxtrio.run.driver"),
    "relaxtrio.rollout": (*WEB, "torch", "relaxtrio.api", "relaxtrio.engine", "relaxtrio.train",
                          "relaxtrio.run.driver"),
    "relaxtrio.train": ("trio", *WEB, "httpx", "relaxtrio.nursery", "relaxtrio.api",
                        "relaxtrio.rollout", "relaxtrio.engine", "relaxtrio.sglang", "relaxtrio.chat",
                        "relaxtrio.run.driver"),
    "relaxtrio._serving": ("torch", "transformers", "quart", "quart_trio", "httpx", "relaxtrio.forest",
                           "relaxtrio.nursery", "relaxtrio.chat", "relaxtrio.sglang", "relaxtrio.engine",
                           "relaxtrio.config", *UPPER),
    "relaxtrio.engine.server": ("relaxtrio.nursery", "relaxtrio.api", "relaxtrio.rollout",
                                "relaxtrio.train", "relaxtrio.chat", "relaxtrio.run.driver"),
    # Sharded training needs torch.distributed, never Ray; only relaxtrio.cluster imports Ray,
    # and only its modules, not the package itself, nor the driver or CLI until a run asks.
    "relaxtrio.train.ranks": ("ray", "trio", *WEB, "httpx", "relaxtrio.nursery", "relaxtrio.api",
                              "relaxtrio.rollout", "relaxtrio.cluster", "relaxtrio.run.driver"),
    "relaxtrio.train.distributed": ("ray", "trio", *WEB, "httpx", "relaxtrio.cluster"),
    "relaxtrio.cluster": ("ray", "torch", "trio", *WEB, "httpx"),
    "relaxtrio.cluster.trainer": (*WEB, "httpx", "relaxtrio.api", "relaxtrio.rollout", "relaxtrio.run.driver"),
    "relaxtrio.cluster.agents": (*WEB, "torch", "relaxtrio.api", "relaxtrio.rollout", "relaxtrio.train",
                                 "relaxtrio.run.driver"),
    # Every agent actor start imports this module: keep it light (no torch, transformers, numpy).
    "relaxtrio.cluster._agent_actor": (*WEB, "httpx", "torch", "transformers", "numpy", "relaxtrio.forest",
                                       "relaxtrio.api", "relaxtrio.rollout", "relaxtrio.train",
                                       "relaxtrio.chat", "relaxtrio.run.driver"),
    "relaxtrio.cluster.engines": (*WEB, "torch", "relaxtrio.api", "relaxtrio.rollout", "relaxtrio.train",
                                  "relaxtrio.run.driver"),
    "relaxtrio.fleet.starter": ("ray", "relaxtrio.cluster"),
    "relaxtrio.run.inference": ("ray", "relaxtrio.cluster"),
    "relaxtrio.run.checkpoint": ("ray", "relaxtrio.cluster"),
    # Spans are optional (``relaxtrio[otel]``): the SDK loads only when a flag asks for it.
    "relaxtrio.tracing": ("opentelemetry", "torch", "transformers", *WEB, "httpx", "relaxtrio.forest",
                          "relaxtrio.nursery", "relaxtrio.sglang", *UPPER),
    "relaxtrio.run.summary": (*HEAVY, "relaxtrio.forest", "relaxtrio.nursery", *UPPER),
    "relaxtrio.run.driver": ("ray", "relaxtrio.cluster"),
    # The directory checks run in the CLI before a run starts: no event loop, web or engine stack.
    "relaxtrio.run.run_dirs": ("trio", *WEB, "httpx", "relaxtrio.api", "relaxtrio.rollout", "relaxtrio.fleet",
                               "relaxtrio.cluster", "relaxtrio.run.driver"),
    "relaxtrio.run.placement": ("relaxtrio.cluster", "relaxtrio.api", "relaxtrio.rollout", "relaxtrio.run.driver"),
    "relaxtrio.run.step": ("relaxtrio.cluster", "relaxtrio.api", "relaxtrio.run.driver"),
    "relaxtrio.nursery.session_task": (*WEB, "httpx", "torch", "transformers", "relaxtrio.chat",
                                       "relaxtrio.sglang", "relaxtrio.engine", *UPPER),
    # ``train --help`` answers without loading torch or the engine stack.
    "relaxtrio.cli.train_flags": ("torch", "transformers", "relaxtrio.cluster", "relaxtrio.fleet",
                                  "relaxtrio.run.driver"),
    "relaxtrio.cli.main": ("ray", "relaxtrio.cluster"),
}
# Ray is optional (``relaxtrio[ray]``): no package below the cluster layer may load it.
FORBIDDEN.update({name: (*banned, "ray") for name, banned in FORBIDDEN.items()
                  if not name.startswith("relaxtrio.cluster.")})


@pytest.mark.slow
@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_it_may(package: str) -> None:
    code = f"import {package}, sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    bad = sorted(m for m in FORBIDDEN[package] if m in loaded)
    assert not bad, f"{package} pulls in {bad}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Every relaxtrio module → the relaxtrio modules it imports anywhere in its source."""
    modules = {_module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                candidates = [target, *(f"{target}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            graph[name].update(c for c in candidates if c in modules and c != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_relaxtrio_modules() -> None:
    cycles = _cycles(import_graph())
    assert not cycles, f"import cycles (TYPE_CHECKING and function-local imports count): {cycles}"


def test_cycle_finder_sees_a_cycle() -> None:
    """The finder itself: a hidden two-module cycle is reported, a chain is not."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def units() -> set[str]:
    """The parts of relaxtrio the package map has a row for: every subpackage and every loose
    module beside ``__init__.py`` (``__main__`` included)."""
    packages = {p.name for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").is_file()}
    return packages | {p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__"}


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def unit_imports() -> dict[str, dict[str, str]]:
    """unit → {imported unit: one importing module, for the message}, over the static graph."""
    found: dict[str, dict[str, str]] = {name: {} for name in units()}
    for module, targets in import_graph().items():
        source = _unit(module)
        if source is None:
            continue
        for target in sorted(targets):
            unit = _unit(target)
            if unit is not None and unit != source:
                found[source].setdefault(unit, module)
    return found


_ROW_UNIT = re.compile(r"^`relaxtrio/(\w+)(?:/|\.py)`$")
_TICKED = re.compile(r"`([^`]+)`")


def documented_map(text: str, known: set[str]) -> dict[str, set[str]]:
    """The table under ``## Packages``: row unit → the relaxtrio units its "may import" cell names.

    A row is ``| `relaxtrio/<name>/` or `relaxtrio/<name>.py` | owns | may import |``; in the last
    cell a name in backticks is a relaxtrio package or module (``sglang.wire`` counts as
    ``sglang``), anything else is written plain.

    Raises:
        ValueError: a malformed row, a repeated row, or a backticked name that is no unit.
    """
    section = text.split("\n## Packages\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("|---") or line.startswith("| package "):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        match = _ROW_UNIT.match(cells[0])
        if len(cells) != 3 or match is None:
            raise ValueError(f"not a package-map row (3 cells, `relaxtrio/<name>/`): {line}")
        if match.group(1) in rows:
            raise ValueError(f"two rows for {match.group(1)}")
        names = {name.split(".")[0] for name in _TICKED.findall(cells[2])}
        if names - known:
            raise ValueError(f"row {match.group(1)}: {sorted(names - known)} in backticks are no "
                             "relaxtrio package or module (write third-party names plain)")
        rows[match.group(1)] = names
    return rows


def test_package_map_parser_reads_rows_and_refuses_strays() -> None:
    """The parser itself: it reads the units of a row, and a stray backticked name fails."""
    text = ("# t\n\n## Packages\n\n| package | owns | may import |\n|---|---|---|\n"
            "| `relaxtrio/api/` | routes | `forest`, `nursery.turns`, quart |\n\n## Next\n| x |\n")
    assert documented_map(text, {"api", "forest", "nursery"}) == {"api": {"forest", "nursery"}}
    with pytest.raises(ValueError, match="quart"):
        documented_map(text.replace("quart", "`quart`"), {"api", "forest", "nursery"})


def test_package_map_in_architecture_doc_matches_the_import_graph() -> None:
    known = units()
    documented = documented_map(ARCHITECTURE.read_text(encoding="utf-8"), known)
    actual = unit_imports()
    problems = [f"no row for relaxtrio/{name}" for name in sorted(known - documented.keys())]
    problems += [f"row {name}: relaxtrio/{name} does not exist" for name in sorted(documented.keys() - known)]
    for name in sorted(documented.keys() & known):
        for unit in sorted(actual[name].keys() - documented[name]):
            problems.append(f"row {name}: add `{unit}` ({actual[name][unit]} imports it), if that "
                            "arrow is allowed")
        for unit in sorted(documented[name] - actual[name].keys()):
            problems.append(f"row {name}: drop `{unit}` (nothing in relaxtrio.{name} imports it)")
    for name, banned in FORBIDDEN.items():
        unit = _unit(name)
        if name == f"relaxtrio.{unit}" and unit in documented:
            clash = {_unit(b) for b in banned if b.count(".") == 1 and b.startswith("relaxtrio.")}
            problems += [f"row {unit}: `{c}` is in FORBIDDEN[{name!r}]" for c in sorted(clash & documented[unit])]
    assert not problems, "docs/architecture.md#packages is out of date:\n" + "\n".join(problems)


MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_LOOSE_MODULES = 8  # besides __init__.py and __main__.py: the basement (errors, validation, ...)


def test_modules_and_functions_stay_small() -> None:
    """A module past 500 lines or a function past 80 owns two things (docs/architecture.md#packages); at most eight
    loose modules sit beside the packages, none of them a command."""
    problems = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(PACKAGE_DIR.parent).as_posix()
        if (num_lines := text.count("\n")) > MAX_MODULE_LINES:
            problems.append(f"{name}: {num_lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    problems.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    loose = sorted(p.name for p in PACKAGE_DIR.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    if len(loose) > MAX_LOOSE_MODULES:
        problems.append(f"{len(loose)} loose modules in relaxtrio/: {loose}")
    # _reaper.py is the shim every launched process runs under (python -S -P, no package
    # imports), so it has a main(); it is no command a user runs.
    problems += [f"relaxtrio/{p}: a loose module with a main()" for p in loose
                 if p != "_reaper.py" and "\ndef main(" in (PACKAGE_DIR / p).read_text(encoding="utf-8")]
    assert not problems, "\n".join(problems)
