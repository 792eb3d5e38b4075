"""Fixtures shared by every test directory.

One meaning per fixture name across the suite: ``tiny_model_dir`` is the tiny random chat model
(trained tokenizer, ChatML + tools template) and ``tokenizer`` its tokenizer; the trainer's
tokenizer-less model is ``tiny_llama_dir`` (tests/train), the vision model ``tiny_vlm_dir``
(tests/support/vlm.py). Shared helpers (Sessions, Groups, served apps, agents) are in tests/support,
imported as ``tests.support.<module>``: tests/ is a package, so no test folder (tests/sglang,
tests/vllm) can shadow the engine package of the same name on ``sys.path``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
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
    model cache stays where it was."""
    real_home = os.path.expanduser("~")
    _saved_env.update(HOME=os.environ.get("HOME"), RELAXTRIO_CACHE_DIR=os.environ.get("RELAXTRIO_CACHE_DIR"))
    os.environ.setdefault("RELAXTRIO_CACHE_DIR", os.path.join(real_home, ".cache", "relaxtrio"))
    os.environ["HOME"] = tempfile.mkdtemp(prefix="relaxtrio-test-home-")


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
