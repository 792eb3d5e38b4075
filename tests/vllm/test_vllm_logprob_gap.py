"""The rollout/trainer logprob gap on a real vLLM server, and the off-policy corrections on it.

vLLM samples with its own kernels; the trainer recomputes the same tokens with transformers.
At T = 1.0 and T = 0.7 the test prints the per-token gap ``|rollout - trainer|`` over several
seeded samples and holds it under :data:`GAP_BOUND`. The server runs with ``--logprobs-mode
processed_logprobs`` (tests/vllm/conftest.py, and what relaxtrio launches); at T = 0.7 the test
also checks the answer is the tempered distribution (the one the trainer's loss uses) and not the
raw one, which is what a server in the default ``raw_logprobs`` mode returns.

Then the importance weights of ``--use-tis`` and ``--use-icepop``
(:mod:`relaxtrio.train.offpolicy`) are computed from those real rollout logprobs: at their
default bounds they are finite, within ``GAP_BOUND`` of 1 and touch no token; with IcePop's band
narrowed to the measured gap (a bound between two measured values, at or above their median),
it masks exactly the tokens whose gap is above that bound.
"""

from __future__ import annotations

import math
from typing import Final

import pytest
import torch
import trio
from tests.vllm.vllm_helpers import VllmServer

from relaxtrio.config import TrainConfig
from relaxtrio.models import load_model
from relaxtrio.train.offpolicy import icepop_weights, tis_weights
from relaxtrio.vllm.client import SamplingParams
from relaxtrio.vllm.connections import open_vllm_client

pytestmark = pytest.mark.slow  # a real vLLM server

PROMPT: Final = (1, 9690, 198, 2683, 359, 253, 5356, 11173, 30, 2, 198, 1, 520, 9531, 198)
SEEDS: Final = (1, 2, 3, 4)
NEW_TOKENS: Final = 48
GAP_BOUND: Final = 1e-3
"""Largest per-token ``|rollout - trainer|`` accepted. Both sides run SmolLM2 in fp32 on the
same weights, so the gap is reduction-order noise: measured max 3.2e-5 (T = 1.0) and 3.0e-5
(T = 0.7) over 192 tokens each. 1e-3 leaves a 30x margin for other CPUs and batch shapes, and
stays two orders below what a real fault costs: raw instead of tempered logprobs at T = 0.7 are
off by 0.31 per token on average (asserted below to exceed 0.1)."""


def _trainer_logprobs(model_dir, samples: list[tuple[int, ...]], temperature: float
                      ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per sample, the trainer's tempered and raw logprobs of its output tokens (``(N,)`` each)."""
    model = load_model(model_dir)
    tempered, raw = [], []
    with torch.no_grad():
        for output in samples:
            ids = torch.tensor([PROMPT + output])  # (1, P + N)
            logits = model(ids).logits[0, len(PROMPT) - 1:-1].float()  # (N, V)
            targets = ids[0, len(PROMPT):, None]
            tempered.append(torch.log_softmax(logits / temperature, -1).gather(1, targets)[:, 0])
            raw.append(torch.log_softmax(logits, -1).gather(1, targets)[:, 0])
    return tempered, raw


def _split_between(values: torch.Tensor) -> float:
    """A threshold near the median of ``values`` that lies halfway between two of them, so no
    value sits on it (float32 rounding of ``exp`` cannot move a token across)."""
    ordered = torch.sort(values).values.tolist()
    middle = len(ordered) // 2
    lo, hi = ordered[middle - 1], ordered[middle]
    step = middle
    while hi - lo < 1e-6 and step < len(ordered) - 1:  # equal values: take the next distinct one
        step += 1
        lo, hi = ordered[step - 1], ordered[step]
    return (lo + hi) / 2


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_rollout_logprob_gap_and_the_offpolicy_weights_on_it(
        vllm_server: VllmServer, temperature: float):
    sampled = []
    with trio.fail_after(300):
        async with open_vllm_client(vllm_server.url) as client:
            for seed in SEEDS:
                sampled.append(await client.generate(PROMPT, SamplingParams(
                    max_new_tokens=NEW_TOKENS, temperature=temperature, sampling_seed=seed,
                    ignore_eos=True), rid=f"gap-{temperature}-{seed}"))
    outputs = [tuple(s.output_ids) for s in sampled]
    tempered, raw = await trio.to_thread.run_sync(_trainer_logprobs, vllm_server.model_dir,
                                                  outputs, temperature)
    rollout = torch.cat([torch.tensor(s.output_logprobs, dtype=torch.float32) for s in sampled])
    old = torch.cat(tempered)  # (S * N,)
    gap = (rollout - old).abs()
    raw_gap = (rollout - torch.cat(raw)).abs()
    print(f"\nvLLM T={temperature}: {len(gap)} tokens, |rollout - trainer| max {gap.max():.2e} "
          f"mean {gap.mean():.2e}; against the untempered logprobs: mean {raw_gap.mean():.2e}")
    assert gap.max().item() < GAP_BOUND
    if temperature != 1.0:  # processed (tempered) logprobs, not raw ones
        assert raw_gap.mean().item() > 100 * GAP_BOUND

    defaults = TrainConfig()
    mask = torch.ones(1, len(gap))
    tis, tis_stats = tis_weights(old[None], rollout[None], mask, clip_high=defaults.tis_clip,
                                 clip_low=defaults.tis_clip_low)
    ice, ice_stats = icepop_weights(old[None], rollout[None], mask, low=defaults.icepop_low,
                                    high=defaults.icepop_high)
    for weights in (tis, ice):
        assert torch.isfinite(weights).all()
        assert (weights - 1).abs().max().item() < 2 * GAP_BOUND  # exp(1e-3) - 1 ~ 1e-3
    assert tis_stats["tis_clip_fraction"] == 0.0 and ice_stats["icepop_masked_fraction"] == 0.0

    # IcePop's band narrowed to the measured gap: it masks the tokens beyond it, and only those.
    bound = _split_between(gap)
    narrow, narrow_stats = icepop_weights(old[None], rollout[None], mask, low=math.exp(-bound),
                                          high=math.exp(bound))
    beyond = gap > bound
    print(f"IcePop band exp(+-{bound:.2e}): masked {narrow_stats['icepop_masked_fraction']:.2f} "
          f"of the tokens")
    assert 0 < int(beyond.sum()) < len(gap)
    assert torch.equal(narrow[0] == 0, beyond)
    assert narrow_stats["icepop_masked_fraction"] == pytest.approx(beyond.float().mean().item())
    assert torch.allclose(narrow[0][~beyond], torch.exp(old - rollout)[~beyond])
