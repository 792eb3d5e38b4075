"""Fixtures shared by every test directory.

One meaning per fixture name across the suite: ``tiny_model_dir`` is the tiny random chat model
(trained tokenizer, ChatML + tools template) and ``tokenizer`` its tokenizer; the trainer's
tokenizer-less model is ``tiny_llama_dir`` (tests/train), the vision model ``tiny_vlm_dir``
(tests/support/vlm.py). Shared helpers (Sessions, Groups, served apps, agents) are in tests/support,
imported as ``tests.support.<module>``: tests/ is a package, so no test folder (tests/sglang,
tests/vllm) can shadow the engine package of the same name on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaxtrio.models import load_tokenizer
from relaxtrio.testing.tiny_models import build_tiny_model

pytest_plugins = ["tests.support.engine", "tests.support.vlm"]

_saved_env: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Agents run as ``bash -lc`` and would source the machine's login profile; give them an
    empty HOME so a test's agent starts the same everywhere (a user's ``~/.profile`` can be slow,
    e.g. ``pyenv init`` rehashing shims under a lock that a killed agent may leave behind). The
    model cache stays where it was. Then the process watch starts (:class:`_ProcessWatch`)."""
    real_home = os.path.expanduser("~")
    _saved_env.update(HOME=os.environ.get("HOME"), RELAXTRIO_CACHE_DIR=os.environ.get("RELAXTRIO_CACHE_DIR"))
    os.environ.setdefault("RELAXTRIO_CACHE_DIR", os.path.join(real_home, ".cache", "relaxtrio"))
    os.environ["HOME"] = tempfile.mkdtemp(prefix="relaxtrio-test-home-")
    _audit_multiprocessing_spawns()
    sys.addaudithook(_watch.audit)


def pytest_unconfigure(config: pytest.Config) -> None:
    test_home = os.environ.get("HOME")
    for key, value in _saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if test_home and Path(test_home).name.startswith("relaxtrio-test-home-"):
        shutil.rmtree(test_home, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with an offline-trained tokenizer and the ChatML+tools template."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    """The tokenizer of :func:`tiny_model_dir`."""
    return load_tokenizer(tiny_model_dir)


_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                             "os.exec", "os.system", "multiprocessing.spawn"})
"""Audit events that start a process. ``multiprocessing``'s spawn start method (torch ranks) raises
none of its own; :func:`_audit_multiprocessing_spawns` adds ``multiprocessing.spawn``."""

_PROBES = frozenset({"uname", "fc-list", "ldconfig"})
"""Commands libraries run for a moment to learn about the machine (``platform.processor()``,
matplotlib's font cache, ctypes' library lookup): not what the mark is about."""


class _ProcessWatch:
    """Fails a test that starts a real process (engine, agent, browser, CLI, Ray, torch ranks)
    without the ``slow`` mark, so ``pytest -m "not slow"`` stays fast and no test forgets its
    mark. The check runs in the test's setup, call and teardown; a session fixture that starts an
    engine fails the first unmarked test that asks for it."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.started: list[str] = []

    def audit(self, event: str, args: tuple) -> None:
        if event in _PROCESS_EVENTS and self.item is not None and not _is_probe(args):
            self.started.append(f"{event} {str(args[:2])[:160]}")

    @contextlib.contextmanager
    def watching(self, item: pytest.Item) -> Iterator[None]:
        if item.get_closest_marker("slow") is not None:
            yield
            return
        self.item, self.started = item, []
        try:
            yield
        finally:
            self.item = None
        if self.started:
            pytest.fail(f"{item.nodeid} starts a real process but is not marked slow "
                        f"(@pytest.mark.slow or a module pytestmark): {self.started[0]}", pytrace=False)


def _is_probe(args: tuple) -> bool:
    executable = args[0] if args else None
    return isinstance(executable, str | bytes) and os.path.basename(os.fsdecode(executable)) in _PROBES


_watch = _ProcessWatch()


def _audit_multiprocessing_spawns() -> None:
    spawnv_passfds = multiprocessing.util.spawnv_passfds

    @functools.wraps(spawnv_passfds)
    def audited(path, args, passfds):  # type: ignore[no-untyped-def]
        sys.audit("multiprocessing.spawn", path, args)
        return spawnv_passfds(path, args, passfds)

    multiprocessing.util.spawnv_passfds = audited


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _watch.watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _watch.watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _watch.watching(item):
        return (yield)
