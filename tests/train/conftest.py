"""Fixtures for relaxtrio.train tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.train.train_helpers import build_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama without a tokenizer (vocab 128): the trainer's own test model.

    Not ``tiny_model_dir`` (tests/conftest.py), which is a chat model with a trained tokenizer."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))
