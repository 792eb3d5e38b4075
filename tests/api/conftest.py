"""Fixtures for API tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from api_helpers import ScriptedHandler

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.models import load_tokenizer
from relaxtrio.nursery.session import SessionRegistry


@pytest.fixture
def registry() -> SessionRegistry:
    return SessionRegistry()


@pytest.fixture
def handler() -> ScriptedHandler:
    return ScriptedHandler()


@pytest.fixture(scope="session")
def api_model_dir(tiny_model_dir: Path) -> Path:
    """The shared tiny random chat model (ChatML + tools template)."""
    return tiny_model_dir


@pytest.fixture(scope="session")
def compiler(api_model_dir: Path) -> ChatCompiler:
    return ChatCompiler(load_tokenizer(api_model_dir))
