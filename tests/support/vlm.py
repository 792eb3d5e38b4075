"""Vision fixtures (a pytest plugin loaded by tests/conftest.py): one tiny random Qwen2-VL per
session, built offline, for the image tests of every package."""

from __future__ import annotations

from pathlib import Path

import pytest

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.media.vision import VisionProcessor
from relaxtrio.models import load_model, load_tokenizer
from relaxtrio.testing.tiny_models import build_tiny_vlm


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2-VL with the vision tokens, PIL image processor and vision template."""
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=0)


@pytest.fixture(scope="session")
def vlm_model(tiny_vlm_dir: Path):
    return load_model(tiny_vlm_dir)


@pytest.fixture(scope="session")
def vlm_tokenizer(tiny_vlm_dir: Path):
    return load_tokenizer(tiny_vlm_dir)


@pytest.fixture(scope="session")
def vlm_vision(tiny_vlm_dir: Path) -> VisionProcessor:
    vision = VisionProcessor.from_pretrained(tiny_vlm_dir)
    assert vision is not None
    return vision


@pytest.fixture(scope="session")
def vlm_compiler(tiny_vlm_dir: Path) -> ChatCompiler:
    """The tiny VLM's compiler with its own template and vision processor."""
    return ChatCompiler.from_pretrained(tiny_vlm_dir)
