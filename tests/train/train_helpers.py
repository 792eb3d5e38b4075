"""Helpers for relaxtrio.train tests: a tiny random Llama (HF layout) and fake samples."""

from __future__ import annotations

import random
from pathlib import Path

import attrs
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB_SIZE = 128


@attrs.frozen
class FakeSample:
    """Duck-typed ``TrainingSample``: only the fields the trainer reads."""

    token_ids: tuple[int, ...] = attrs.field(converter=tuple)
    loss_mask: tuple[int, ...] = attrs.field(converter=tuple)
    rollout_logprobs: tuple[float, ...] = attrs.field(converter=tuple)


def build_tiny_llama(out_dir: Path, *, seed: int = 0) -> Path:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir)
    return out_dir


def make_samples(
    num_samples: int, *, seed: int = 0, min_len: int = 6, max_len: int = 20
) -> list[FakeSample]:
    """Random prompt + response samples of varying length; rollout logprobs are placeholders."""
    rng = random.Random(seed)
    out = []
    for _ in range(num_samples):
        n = rng.randint(min_len, max_len)
        prompt = rng.randint(2, n - 2)
        token_ids = [rng.randrange(2, VOCAB_SIZE) for _ in range(n)]
        loss_mask = [0] * prompt + [1] * (n - prompt)
        out.append(FakeSample(token_ids, loss_mask, [0.0] * n))
    return out


def with_rollout_logprobs(
    samples: list[FakeSample], logprobs: list[list[float]], *, offset: float = 0.0
) -> list[FakeSample]:
    """Copy ``samples`` with rollout logprobs = ``logprobs + offset`` on the loss mask, else 0."""
    return [
        attrs.evolve(
            s,
            rollout_logprobs=[
                lp + offset if m else 0.0 for lp, m in zip(lps, s.loss_mask, strict=True)
            ],
        )
        for s, lps in zip(samples, logprobs, strict=True)
    ]
