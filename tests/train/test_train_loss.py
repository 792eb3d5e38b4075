"""relaxtrio.train.loss: policy_loss math and token logprobs against manual computations."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from relaxtrio.train import entropy_from_logits, logprobs_from_logits, policy_loss, token_logprobs


def _row(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float32)  # (1, T)


def test_ratio_one_gives_minus_mean_advantage() -> None:
    old = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -0.3, -0.7, -9.0]])  # (2, 4)
    adv = torch.tensor([[0.0, 2.0, 2.0, 2.0], [0.0, -1.0, -1.0, 5.0]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.float32)
    logprobs = old.clone().requires_grad_(True)
    loss, stats = policy_loss(logprobs, old, adv, mask)
    # token mean over the 5 masked tokens: (2 + 2 + 2 - 1 - 1) / 5
    assert loss.item() == pytest.approx(-(4.0 / 5.0), abs=1e-7)
    assert stats["clip_fraction"] == 0.0
    assert stats["ppo_kl"] == 0.0
    assert stats["approx_kl_k3"] == 0.0
    assert stats["num_tokens"] == 5.0
    loss.backward()
    # d loss / d logprob_t = -A_t / N at ratio 1, zero off the mask
    expected = -(adv * mask) / 5.0
    torch.testing.assert_close(logprobs.grad, expected)


def test_clip_fraction_and_loss_on_constructed_case() -> None:
    ratios = [1.0, 1.5, 1.5, 0.5, 0.5, 1.1, 1.0, 3.0]
    adv = [0.0, 1.0, -1.0, -1.0, 1.0, 1.0, 0.0, 1.0]
    mask = [0, 1, 1, 1, 1, 1, 1, 0]  # position 0 and the last one are off the mask
    old = _row([-1.0] * 8)
    logprobs = old + torch.log(_row(ratios))
    loss, stats = policy_loss(
        logprobs, old, _row(adv), _row(mask), clip_eps_low=0.2, clip_eps_high=0.2
    )
    # active clipped term: (1.5, +1) -> clipped at 1.2 and (0.5, -1) -> clipped at 0.8.
    # (1.5, -1), (0.5, +1), (1.1, +1), (1.0, 0) keep the unclipped term; the 3.0 one is masked.
    assert stats["clip_fraction"] == pytest.approx(2 / 6)
    per_token = [-1.2, 1.5, 0.8, -0.5, -1.1, 0.0]
    assert loss.item() == pytest.approx(sum(per_token) / 6, abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(sum(per_token) / 6, abs=1e-6)
    masked_ratios = [1.5, 1.5, 0.5, 0.5, 1.1, 1.0]
    k1 = -sum(math.log(r) for r in masked_ratios) / 6
    k3 = sum(r - 1 - math.log(r) for r in masked_ratios) / 6
    assert stats["ppo_kl"] == pytest.approx(k1, abs=1e-6)
    assert stats["approx_kl_k3"] == pytest.approx(k3, abs=1e-6)
    assert stats["approx_kl_k3"] > 0


def test_clip_higher_is_asymmetric() -> None:
    old = _row([0.0, -1.0, -1.0])
    logprobs = old + torch.log(_row([1.0, 1.25, 0.75]))
    adv, mask = _row([0.0, 1.0, -1.0]), _row([0, 1, 1])
    _, sym = policy_loss(logprobs, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2)
    _, dapo = policy_loss(logprobs, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    # symmetric: 1.25 > 1.2 with A > 0 and 0.75 < 0.8 with A < 0 are both clipped
    assert sym["clip_fraction"] == pytest.approx(1.0)
    assert dapo["clip_fraction"] == pytest.approx(0.5)  # 1.25 < 1.28 is no longer clipped


def test_clipped_tokens_get_no_gradient() -> None:
    old = _row([0.0, -1.0, -1.0])
    logprobs = (old + torch.log(_row([1.0, 1.5, 1.1]))).requires_grad_(True)
    loss, _ = policy_loss(logprobs, old, _row([0.0, 1.0, 1.0]), _row([0, 1, 1]))
    loss.backward()
    assert logprobs.grad[0, 1].item() == 0.0  # clipped (1.5 > 1.2, A > 0)
    assert logprobs.grad[0, 2].item() == pytest.approx(-1.1 / 2, rel=1e-5)  # d(-r A / N)/d logprob


def test_masked_tokens_do_not_affect_loss_or_grads() -> None:
    torch.manual_seed(0)
    old = -torch.rand(2, 6)
    base = old + 0.1 * torch.randn(2, 6)
    adv = torch.randn(2, 6)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.float32)
    a = base.clone().requires_grad_(True)
    loss_a, stats_a = policy_loss(a, old, adv, mask)
    loss_a.backward()

    garbage = base.clone()
    off = mask == 0
    garbage[off] = torch.tensor([math.inf, math.nan, -math.inf, 50.0, -50.0, 7.0])[: int(off.sum())]
    adv_garbage = adv.clone()
    adv_garbage[off] = math.nan
    old_garbage = old.clone()
    old_garbage[off] = -math.inf
    b = garbage.clone().requires_grad_(True)
    loss_b, stats_b = policy_loss(b, old_garbage, adv_garbage, mask)
    loss_b.backward()

    assert loss_b.item() == loss_a.item()
    assert stats_b == stats_a
    torch.testing.assert_close(b.grad, a.grad)
    assert torch.all(b.grad[off] == 0)


def test_loss_denominator_tokens_scales_loss_not_stats() -> None:
    old = _row([0.0, -1.0, -2.0])
    logprobs = old + 0.05
    adv, mask = _row([0.0, 1.0, -0.5]), _row([0, 1, 1])
    loss, stats = policy_loss(logprobs, old, adv, mask)
    loss_10, stats_10 = policy_loss(logprobs, old, adv, mask, loss_denominator_tokens=10)
    assert loss_10.item() == pytest.approx(loss.item() * 2 / 10, rel=1e-6)
    assert stats_10 == stats


def test_no_masked_tokens_gives_zero_loss() -> None:
    x = _row([0.0, -1.0]).requires_grad_(True)
    loss, stats = policy_loss(x, x.detach(), _row([1.0, 1.0]), _row([0, 0]))
    assert loss.item() == 0.0 and stats["num_tokens"] == 0.0


def test_shape_mismatch_is_rejected() -> None:
    with pytest.raises(ValueError, match="equal shapes"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3))


# ---------------------------------------------------------------------------- token logprobs


@pytest.fixture(scope="module")
def tiny_llama(tiny_llama_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def _manual_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """Reference: one unpadded sequence, plain log_softmax, no chunking."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]  # (T, V)
        logp = torch.log_softmax(logits.double(), dim=-1)  # (T, V)
        return [0.0] + [logp[t, ids[t + 1]].item() for t in range(len(ids) - 1)]


def test_token_logprobs_matches_manual_and_ignores_padding(tiny_llama: torch.nn.Module) -> None:
    seqs = [[5, 9, 17, 3, 44, 2, 7, 81], [12, 13, 14], [100, 3, 3, 3, 60, 11]]
    T = max(map(len, seqs))
    token_ids = torch.zeros(len(seqs), T, dtype=torch.long)
    attention_mask = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        token_ids[b, : len(s)] = torch.tensor(s)
        attention_mask[b, : len(s)] = 1
    with torch.no_grad():
        out = token_logprobs(tiny_llama, token_ids, attention_mask)  # (B, T)
        tiny = token_logprobs(tiny_llama, token_ids, attention_mask, chunk_tokens=1)
    assert out.shape == (3, T) and out.dtype == torch.float32
    torch.testing.assert_close(tiny, out, rtol=0, atol=1e-6)
    for b, s in enumerate(seqs):
        ref = torch.tensor(_manual_logprobs(tiny_llama, s), dtype=torch.float32)
        torch.testing.assert_close(out[b, : len(s)], ref, rtol=0, atol=1e-5)
        assert torch.all(out[b, len(s) :] == 0)  # padding positions are 0.0
        assert out[b, 0].item() == 0.0
        assert torch.all(out[b, 1 : len(s)] < 0)


def test_chunked_logprobs_have_the_same_gradient() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, 7, 11, dtype=torch.float32)
    token_ids = torch.randint(0, 11, (2, 7))
    weights = torch.randn(2, 7)
    a = logits.clone().requires_grad_(True)
    (logprobs_from_logits(a, token_ids, chunk_tokens=2) * weights).sum().backward()
    b = logits.clone().requires_grad_(True)
    ref = torch.log_softmax(b[:, :-1], dim=-1).gather(-1, token_ids[:, 1:, None]).squeeze(-1)
    (ref * weights[:, 1:]).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_entropy_from_logits_matches_definition() -> None:
    torch.manual_seed(2)
    logits = torch.randn(3, 5, 13)
    ent = entropy_from_logits(logits, chunk_tokens=4)  # (3, 5)
    p = torch.softmax(logits[:, :-1].double(), dim=-1)
    ref = -(p * p.log()).sum(-1).float()  # (3, 4)
    assert torch.all(ent[:, 0] == 0)
    torch.testing.assert_close(ent[:, 1:], ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 2.5])
def test_logprobs_and_entropy_use_the_temperature(temperature: float) -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11) * 3  # (B, T, V)
    token_ids = torch.randint(0, 11, (2, 5))
    got = logprobs_from_logits(logits, token_ids, temperature=temperature, chunk_tokens=3)
    manual = torch.log_softmax(logits / temperature, dim=-1)  # (B, T, V)
    expected = manual[:, :-1].gather(-1, token_ids[:, 1:, None]).squeeze(-1)  # (B, T - 1)
    torch.testing.assert_close(got[:, 1:], expected)
    assert (got[:, 0] == 0).all()
    ent = entropy_from_logits(logits, temperature=temperature, chunk_tokens=3)
    torch.testing.assert_close(ent[:, 1:], -(manual.exp() * manual).sum(-1)[:, :-1], atol=1e-4, rtol=1e-4)


def test_greedy_temperature_uses_the_unscaled_distribution() -> None:
    from relaxtrio.train.logprobs import logprob_temperature

    assert logprob_temperature(0.0) == 1.0 and logprob_temperature(5e-7) == 1.0
    assert logprob_temperature(0.7) == 0.7
    with pytest.raises(ValueError, match="temperature"):
        logprob_temperature(-1.0)
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), temperature=0.0)
