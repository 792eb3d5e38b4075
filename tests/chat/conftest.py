"""Session fixtures for the compiler tests: one offline tokenizer + ChatCompiler per template case."""

from __future__ import annotations

import pytest
from tests.chat.compiler_testkit import CASES, make_compiler

from relaxtrio.chat.compiler import ChatCompiler


@pytest.fixture(scope="session")
def compilers() -> dict[str, ChatCompiler]:
    """Template case name → compiler (built once; compilers hold no per-call state)."""
    return {name: make_compiler(case) for name, case in CASES.items()}
