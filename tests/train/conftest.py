"""Fixtures for relaxtrio.train tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import build_tiny_llama


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))
