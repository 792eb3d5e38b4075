"""Fixtures shared by every test directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from relaxtrio.engine.model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with an offline-trained tokenizer and the ChatML+tools template."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)
