"""Fixtures for API tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from api_helpers import ScriptedHandler
from relaxtrio.engine.compiler import ChatCompiler
from relaxtrio.engine.model import build_tiny_model, load_tokenizer
from relaxtrio.nursery.session import SessionRegistry


@pytest.fixture
def registry() -> SessionRegistry:
    return SessionRegistry()


@pytest.fixture
def handler() -> ScriptedHandler:
    return ScriptedHandler()


@pytest.fixture(scope="session")
def api_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random chat model (ChatML + tools template), built once per test session."""
    return build_tiny_model(tmp_path_factory.mktemp("api-tiny-model"), seed=0)


@pytest.fixture(scope="session")
def compiler(api_model_dir: Path) -> ChatCompiler:
    return ChatCompiler(load_tokenizer(api_model_dir))
