"""served_model_mismatch: what an engine's /model_info must agree on with --hf-checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relaxtrio import BackendError, ConfigError
from relaxtrio.models import refuse_other_served_models, served_model_mismatch


@pytest.fixture
def llama_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    return tmp_path


def test_only_what_both_sides_report_is_compared(llama_dir: Path) -> None:
    same = {"model_path": "/elsewhere/SmolLM2", "model_type": "llama",
            "architectures": ["LlamaForCausalLM"]}
    assert served_model_mismatch(same, llama_dir) is None  # another path is not another model
    assert served_model_mismatch({"model_path": "/x", "weight_version": "v"}, llama_dir) is None  # SGLang 0.5.3
    assert served_model_mismatch({"model_type": "qwen2"}, llama_dir) == (
        f"model_type 'qwen2', not 'llama' as in {llama_dir / 'config.json'}")
    assert served_model_mismatch({"model_type": "llama", "architectures": ["MistralForCausalLM"]},
                                 llama_dir).startswith("architectures ['MistralForCausalLM'], not")
    assert served_model_mismatch({"model_type": "qwen2"}, llama_dir / "missing") is None


async def test_another_model_is_refused_naming_the_flag(llama_dir: Path) -> None:
    served = {"http://e:1": {"model_type": "llama"}, "http://e:2": {"model_type": "qwen2"}}

    async def model_info(url: str) -> dict:
        if url not in served:
            raise BackendError(f"{url} unreachable")
        return served[url]

    with pytest.raises(ConfigError, match=r"the engine at http://e:2 serves model_type 'qwen2'") as refused:
        await refuse_other_served_models(model_info, ["http://down:3", "http://e:1", "http://e:2"],
                                         llama_dir)
    assert refused.value.param == "--hf-checkpoint"
    await refuse_other_served_models(model_info, ["http://down:3", "http://e:1"], llama_dir)
