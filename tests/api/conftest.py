"""Fixtures for API tests."""

from __future__ import annotations

import pytest
from tests.api.api_helpers import ScriptedHandler

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.nursery.session import SessionRegistry


@pytest.fixture
def registry() -> SessionRegistry:
    return SessionRegistry()


@pytest.fixture
def handler() -> ScriptedHandler:
    return ScriptedHandler()


@pytest.fixture(scope="session")
def compiler(tokenizer) -> ChatCompiler:
    """The compiler of the shared tiny chat model (tests/conftest.py)."""
    return ChatCompiler(tokenizer)
