"""The per-request sampler: truncation sets, penalties, bias, masks and the logprob convention."""

from __future__ import annotations

import math

import torch

from relaxtrio.engine.sampling import ResolvedSampling, RowSampler

LOGITS = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))  # (V,) with V = 4


def _support(**settings: object) -> set[int]:
    sampler = RowSampler(ResolvedSampling(max_new_tokens=100, sampling_seed=0, **settings))
    return {sampler.choose(LOGITS, 0).token_id for _ in range(400)}


def test_truncation_keeps_the_documented_support() -> None:
    assert _support() == {0, 1, 2, 3}
    assert _support(top_k=2) == {0, 1}
    assert _support(top_p=0.7) == {0, 1}  # mass before token 2 is 0.8 > 0.7
    assert _support(top_p=0.85) == {0, 1, 2}
    assert _support(min_p=0.5) == {0, 1}  # 0.15 < 0.5 * 0.5
    assert _support(temperature=0.0) == {0}


def test_logprob_is_before_truncation_and_uses_the_temperature() -> None:
    sampler = RowSampler(ResolvedSampling(max_new_tokens=10, temperature=0.5, top_k=1, sampling_seed=0))
    choice = sampler.choose(LOGITS, 0)
    expected = torch.log_softmax(LOGITS / 0.5, dim=-1)[0]
    assert choice.token_id == 0 and math.isclose(choice.logprob, float(expected), rel_tol=1e-6)
    greedy = RowSampler(ResolvedSampling(max_new_tokens=10, temperature=0.0)).choose(LOGITS, 0)
    assert math.isclose(greedy.logprob, math.log(0.5), rel_tol=1e-6)  # greedy: temperature 1


def test_penalties_bias_and_min_new_tokens() -> None:
    flat = torch.zeros(4)
    cfg = ResolvedSampling(max_new_tokens=10, temperature=0.0, frequency_penalty=1.0,
                           logit_bias=((3, 0.5),))
    sampler = RowSampler(cfg)
    assert [sampler.choose(flat, i).token_id for i in range(3)] == [3, 0, 1]
    rep = RowSampler(ResolvedSampling(max_new_tokens=10, temperature=0.0, repetition_penalty=2.0))
    logits = torch.tensor([2.0, 1.5, -1.0, -1.0])
    assert rep.choose(logits, 0).token_id == 0
    assert rep.choose(logits, 1).token_id == 1  # 2.0 / 2 = 1.0 < 1.5
    masked = RowSampler(ResolvedSampling(max_new_tokens=10, temperature=0.0, min_new_tokens=2,
                                         stop_ids=frozenset({0})))
    assert masked.choose(LOGITS, 0).token_id == 1
    assert masked.choose(LOGITS, 1).token_id == 1
    assert masked.choose(LOGITS, 2).token_id == 0


def test_seeded_generators_reproduce() -> None:
    a = RowSampler(ResolvedSampling(max_new_tokens=10, sampling_seed=42))
    b = RowSampler(ResolvedSampling(max_new_tokens=10, sampling_seed=42))
    assert [a.choose(LOGITS, i).token_id for i in range(20)] == [
        b.choose(LOGITS, i).token_id for i in range(20)
    ]
