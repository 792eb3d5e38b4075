"""relaxtrio.train.Trainer on a tiny random Llama (CPU, fp32)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import attrs
import pytest
import torch
from safetensors.torch import load_file
from tests.train.train_helpers import FakeSample, make_samples, with_rollout_logprobs
from transformers import AutoModelForCausalLM

from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import TrainConfig, Trainer
from relaxtrio.train.batching import plan_micro_batches, split_minibatches

FAST = TrainConfig(lr=1e-3, micro_batch_size=4)


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters()}


def _on_policy(
    trainer: Trainer, samples: list[FakeSample], offset: float = 0.0
) -> list[FakeSample]:
    """Rollout logprobs as an engine running the same weights would report them."""
    return with_rollout_logprobs(samples, trainer.compute_logprobs(samples), offset=offset)


def _response_logprob(trainer: Trainer, sample: FakeSample) -> float:
    lps = trainer.compute_logprobs([sample])[0]
    return sum(lp for lp, m in zip(lps, sample.loss_mask, strict=True) if m)


def test_train_step_updates_parameters_and_reports_stats(tiny_llama_dir: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_llama_dir, FAST)
    samples = _on_policy(trainer, make_samples(6, seed=1))
    before = _params(trainer)
    stats = trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5, -0.5, 0.0, 2.0]))

    assert math.isfinite(stats.loss)
    assert stats.grad_norm > 0 and math.isfinite(stats.grad_norm)
    assert stats.num_samples == 6
    assert stats.num_tokens == sum(sum(s.loss_mask) for s in samples)
    assert stats.num_optimizer_steps == 1 and trainer.num_optimizer_steps == 1
    assert stats.num_micro_batches == 2  # 6 samples, 4 per micro-batch
    assert stats.rollout_logprob_abs_diff < 1e-5  # same weights produced the rollout logprobs
    assert stats.rollout_logprob_abs_diff_max < 1e-5
    assert stats.ppo_kl == 0.0 and stats.clip_fraction == 0.0  # ratio == 1 on-policy
    assert 0 < stats.entropy <= math.log(128) + 1e-4
    assert stats.elapsed_s > 0 and stats.lr == 1e-3
    after = _params(trainer)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed and all(torch.isfinite(v).all() for v in after.values())


def test_positive_advantage_raises_and_negative_lowers_logprob(tiny_llama_dir: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_llama_dir, FAST)
    good, bad = _on_policy(trainer, make_samples(2, seed=2, min_len=10))
    good_before, bad_before = _response_logprob(trainer, good), _response_logprob(trainer, bad)
    for _ in range(3):
        trainer.train_step(scored_samples([good, bad], [1.0, -1.0]))
    assert _response_logprob(trainer, good) > good_before + 0.05
    assert _response_logprob(trainer, bad) < bad_before - 0.05


def test_gradient_accumulation_equals_one_big_batch(tiny_llama_dir: Path) -> None:
    samples = make_samples(5, seed=3)
    advantages = [0.7, -1.2, 0.3, 1.5, -0.4]
    deltas, norms, losses = [], [], []
    for micro_batch_size in (1, 2, 5):
        trainer = Trainer.from_pretrained(
            tiny_llama_dir, TrainConfig(micro_batch_size=micro_batch_size, max_grad_norm=1e9)
        )
        # plain SGD with lr 1 turns the parameter change into exactly -grad
        trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
        before = _params(trainer)
        stats = trainer.train_step(scored_samples(_on_policy(trainer, samples), advantages))
        assert stats.num_micro_batches == math.ceil(5 / micro_batch_size)
        after = _params(trainer)
        deltas.append({k: after[k] - before[k] for k in before})
        norms.append(stats.grad_norm)
        losses.append(stats.loss)
    for other in deltas[:2]:
        for k, big in deltas[2].items():
            torch.testing.assert_close(other[k], big, rtol=1e-4, atol=1e-7)
    assert norms[0] == pytest.approx(norms[2], rel=1e-5)
    assert norms[1] == pytest.approx(norms[2], rel=1e-5)
    assert losses[0] == pytest.approx(losses[2], rel=1e-5, abs=1e-7)


def test_zero_advantages_still_count_tokens(tiny_llama_dir: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_llama_dir, FAST)
    samples = make_samples(3, seed=4)
    stats = trainer.train_step(scored_samples(_on_policy(trainer, samples), [0.0, 0.0, 0.0]))
    assert stats.loss == 0.0 and stats.grad_norm == 0.0
    assert stats.num_tokens == sum(sum(s.loss_mask) for s in samples)


def test_two_minibatches_use_pre_update_old_logprobs(tiny_llama_dir: Path) -> None:
    cfg = attrs.evolve(FAST, num_minibatches=2, micro_batch_size=2, clip_eps_high=0.2)
    trainer = Trainer.from_pretrained(tiny_llama_dir, cfg)
    samples = _on_policy(trainer, make_samples(4, seed=5))
    stats = trainer.train_step(scored_samples(samples, [1.0, -1.0, 1.0, -1.0]))
    assert stats.num_optimizer_steps == 2 and trainer.num_optimizer_steps == 2
    assert stats.rollout_logprob_abs_diff < 1e-5
    # the second minibatch is evaluated after the first update: ratio != 1 there
    assert stats.approx_kl_k3 > 0
    assert math.isfinite(stats.loss)


def test_rollout_logprobs_as_old_measures_and_clips_mismatch(tiny_llama_dir: Path) -> None:
    cfg = attrs.evolve(FAST, use_rollout_logprobs_as_old=True, clip_eps_high=0.28)
    trainer = Trainer.from_pretrained(tiny_llama_dir, cfg)
    # the "engine" was 0.5 nats less confident: ratio = e^0.5 ~ 1.65 > 1.28 on every token
    samples = _on_policy(trainer, make_samples(3, seed=6), offset=-0.5)
    stats = trainer.train_step(scored_samples(samples, [1.0, 1.0, 1.0]))
    assert stats.rollout_logprob_abs_diff == pytest.approx(0.5, abs=1e-5)
    assert stats.clip_fraction == 1.0
    assert stats.ppo_kl == pytest.approx(-0.5, abs=1e-5)
    assert stats.grad_norm == 0.0  # every token clipped: no gradient at all


def test_bf16_autocast_step_is_finite(tiny_llama_dir: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_llama_dir, attrs.evolve(FAST, bf16_autocast=True))
    samples = _on_policy(trainer, make_samples(2, seed=7))
    stats = trainer.train_step(scored_samples(samples, [1.0, -1.0]))
    assert math.isfinite(stats.loss) and math.isfinite(stats.grad_norm)
    assert stats.rollout_logprob_abs_diff < 0.5  # bf16 is less exact, but not wildly off
    assert next(trainer.model.parameters()).dtype == torch.float32  # master weights stay fp32


def test_token_budget_packs_micro_batches(tiny_llama_dir: Path) -> None:
    lengths = [10, 10, 30, 5, 5, 5]
    plan = plan_micro_batches(range(6), lengths, micro_batch_size=4, max_tokens_per_micro_batch=20)
    assert plan == [[2], [0, 1], [3, 4, 5]]  # longest first, then cut by count and budget
    cfg = attrs.evolve(FAST, max_tokens_per_micro_batch=40)
    trainer = Trainer.from_pretrained(tiny_llama_dir, cfg)
    samples = make_samples(4, seed=8, min_len=20, max_len=20)
    stats = trainer.train_step(scored_samples(_on_policy(trainer, samples), [1.0, 0.0, -1.0, 0.5]))
    assert stats.num_micro_batches == 2 and stats.num_padded_tokens == 80


def test_micro_batches_group_similar_lengths(tiny_llama_dir: Path) -> None:
    lengths = (10, 40, 10, 40)
    samples = [make_samples(1, seed=i, min_len=n, max_len=n)[0] for i, n in enumerate(lengths)]
    assert plan_micro_batches(range(4), lengths, micro_batch_size=2, max_tokens_per_micro_batch=None) == [
        [1, 3], [0, 2]]
    trainer = Trainer.from_pretrained(tiny_llama_dir, attrs.evolve(FAST, micro_batch_size=2))
    stats = trainer.train_step(scored_samples(_on_policy(trainer, samples), [1.0, -1.0, 0.5, -0.5]))
    # in the given order each pair would pad to 40: 2 x (2 x 40)
    assert stats.num_micro_batches == 2 and stats.num_padded_tokens == 2 * 40 + 2 * 10


@pytest.mark.parametrize("entropy_coef", [0.0, 0.05])
def test_logits_start_at_the_first_trained_token(tiny_llama_dir: Path, entropy_coef: float) -> None:
    """The with-grad forward asks for logits from one position before the micro-batch's first
    trained token on, and the step (loss, statistics, update) is the full-logits one."""
    cfg = attrs.evolve(FAST, entropy_coef=entropy_coef)
    cut, full = Trainer.from_pretrained(tiny_llama_dir, cfg), Trainer.from_pretrained(tiny_llama_dir, cfg)
    full._logits_to_keep = False
    assert cut._logits_to_keep
    samples = _on_policy(cut, make_samples(6, seed=12, min_len=14, max_len=24))
    advantages = [1.0, -1.0, 0.5, -0.5, 0.25, 2.0]
    asked: list[tuple[int, int | None]] = []

    def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        asked.append((kwargs["input_ids"].shape[1], kwargs.get("logits_to_keep")))

    handle = cut.model.register_forward_pre_hook(record, with_kwargs=True)
    a = cut.train_step(scored_samples(samples, advantages))
    handle.remove()
    b = full.train_step(scored_samples(samples, advantages))
    # one forward per micro-batch; its first trained token is at the shortest prompt of the two
    plans = plan_micro_batches(range(6), [len(s.token_ids) for s in samples], micro_batch_size=4,
                               max_tokens_per_micro_batch=None)
    expected = [(max(len(samples[i].token_ids) for i in mb),
                 min(samples[i].loss_mask.index(1) for i in mb) - 1) for mb in plans]
    assert asked == [(T, T - skip) for T, skip in expected] and all(skip > 0 for _, skip in expected)
    for field in ("loss", "entropy", "grad_norm", "rollout_logprob_abs_diff", "clip_fraction"):
        assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-5, abs=1e-7), field
    pairs = zip(cut.model.named_parameters(), full.model.parameters(), strict=True)
    for (name, x), y in pairs:
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7, msg=name)


def test_old_and_reference_passes_start_at_the_first_trained_token(tiny_llama_dir: Path) -> None:
    """Two minibatches (an old-logprob pass) and a KL loss (a reference pass): both no-grad
    passes skip the prompt's logits too, and the step equals the full-logits one."""
    cfg = attrs.evolve(FAST, micro_batch_size=2, num_minibatches=2, use_kl_loss=True, kl_loss_coef=0.1)
    cut, full = Trainer.from_pretrained(tiny_llama_dir, cfg), Trainer.from_pretrained(tiny_llama_dir, cfg)
    full._logits_to_keep = False
    samples = _on_policy(cut, make_samples(6, seed=13, min_len=14, max_len=24))
    advantages = [1.0, -1.0, 0.5, -0.5, 0.25, 2.0]
    asked: list[int | None] = []
    assert cut.ref_model is not None
    handles = [m.register_forward_pre_hook(lambda _m, _a, kw: asked.append(kw.get("logits_to_keep")),
                                           with_kwargs=True) for m in (cut.model, cut.ref_model)]
    a = cut.train_step(scored_samples(samples, advantages))
    for handle in handles:
        handle.remove()
    b = full.train_step(scored_samples(samples, advantages))
    # 3 micro-batches of 2 in the old-logprob pass and in the KL model's pass, 2 per 3-sample minibatch
    assert len(asked) == 3 + 3 + 2 * 2 and all(isinstance(k, int) and k > 0 for k in asked), asked
    for field in ("loss", "grad_norm", "ppo_kl", "kl_loss", "rollout_logprob_abs_diff", "entropy"):
        assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-5, abs=1e-7), field
    pairs = zip(cut.model.named_parameters(), full.model.parameters(), strict=True)
    for (name, x), y in pairs:
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7, msg=name)
    # compute_logprobs still gives every position
    row = cut.compute_logprobs(samples[:1])[0]
    assert all(v != 0.0 for v in row[1:])


def test_split_minibatches_is_a_seeded_partition() -> None:
    import random

    parts = split_minibatches(7, 3, random.Random(0))
    assert sorted(i for p in parts for i in p) == list(range(7))
    assert sorted(map(len, parts)) == [2, 2, 3]
    assert parts == split_minibatches(7, 3, random.Random(0))
    assert split_minibatches(2, 4, random.Random(0)) in ([[0], [1]], [[1], [0]])


@pytest.mark.parametrize(
    ("samples", "advantages", "match"),
    [
        ([], [], "empty"),
        ([FakeSample([1, 2, 3], [0, 1], [0.0, 0.0, 0.0])], [1.0], r"samples\[0\]: len"),
        ([FakeSample([1, 2], [1, 1], [0.0, -1.0])], [1.0], r"loss_mask\[0\] must be 0"),
        ([FakeSample([1, 2], [0, 2], [0.0, -1.0])], [1.0], "only 0 and 1"),
        ([FakeSample([1, 2], [0, 1], [0.0, -1.0])], [math.nan], r"advantages\[0\]"),
        ([FakeSample([1, 2], [0, 1], [0.0, math.nan])], [1.0], r"samples\[0\].rollout_logprobs"),
    ],
)
def test_invalid_inputs_are_rejected(
    tiny_llama_dir: Path, samples: list[FakeSample], advantages: list[float], match: str
) -> None:
    trainer = Trainer.from_pretrained(tiny_llama_dir, FAST)
    before = _params(trainer)
    with pytest.raises(ValueError, match=match):
        trainer.train_step(scored_samples(samples, advantages))
    assert all(torch.equal(before[k], v) for k, v in _params(trainer).items())


def test_save_weights_round_trip(tiny_llama_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_llama_dir, FAST)
    samples = _on_policy(trainer, make_samples(3, seed=9))
    trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5]))
    out = trainer.save_weights(tmp_path / "weights")
    assert out == tmp_path / "weights"
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]

    expected = trainer.compute_logprobs(samples)
    reloaded = Trainer.from_pretrained(out, FAST)
    assert reloaded.compute_logprobs(samples) == expected  # bit-identical

    # An engine that loads the file into its own module: the tied lm_head is stored once.
    engine_model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    result = engine_model.load_state_dict(load_file(out / "model.safetensors"), strict=False)
    assert result.missing_keys == ["lm_head.weight"] and result.unexpected_keys == []
    assert engine_model.lm_head.weight is engine_model.model.embed_tokens.weight
    assert Trainer(engine_model, FAST).compute_logprobs(samples) == expected

    # Saving again replaces the files in place and leaves no temporary directory behind.
    trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5]))
    trainer.save_weights(out)
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
    assert Trainer.from_pretrained(out, FAST).compute_logprobs(samples) != expected


def _write_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, 128)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>")
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    tok.save_pretrained(directory)


def test_save_checkpoint_with_tokenizer_and_optimizer(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer_dir = tmp_path / "tok"
    _write_tokenizer(tokenizer_dir)
    trainer = Trainer.from_pretrained(tiny_llama_dir, FAST)
    samples = _on_policy(trainer, make_samples(3, seed=10))
    trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5]))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "stale.txt").write_text("from an older checkpoint")
    assert trainer.save_checkpoint(ckpt, tokenizer_dir, include_optimizer=True) == ckpt

    assert not (ckpt / "stale.txt").exists()  # the directory was replaced as a whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "tok"]  # no temp dirs left
    assert {"model.safetensors", "config.json", "tokenizer.json", "optimizer.pt"} <= set(
        os.listdir(ckpt)
    )
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok("w5 w7")["input_ids"] == [5, 7]

    resumed = Trainer.from_pretrained(ckpt, FAST)
    assert resumed.compute_logprobs(samples) == trainer.compute_logprobs(samples)
    resumed.load_optimizer_state(ckpt)
    assert resumed.num_optimizer_steps == 1
    # same weights + same AdamW moments => the next step lands on the same weights
    trainer.train_step(scored_samples(samples, [0.5, 0.5, -1.0]))
    resumed.train_step(scored_samples(samples, [0.5, 0.5, -1.0]))
    pairs = zip(trainer.model.named_parameters(), resumed.model.parameters(), strict=True)
    for (name, a), b in pairs:
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7, msg=name)


def test_adamw_is_fused_and_steps_like_the_default_kernel(tiny_llama_dir: Path) -> None:
    fused = Trainer.from_pretrained(tiny_llama_dir, FAST)
    default = Trainer.from_pretrained(tiny_llama_dir, FAST)
    for group in default.optimizer.param_groups:
        group["fused"] = None  # torch's default kernel (foreach or a loop)
    assert all(g["fused"] for g in fused.optimizer.param_groups)
    samples = _on_policy(fused, make_samples(4, seed=3))
    initial = _params(fused)
    for advantages in ([1.0, -1.0, 0.5, 0.0], [-0.5, 1.0, 0.0, 2.0]):  # the 2nd step uses moments
        fused.train_step(scored_samples(samples, advantages))
        default.train_step(scored_samples(samples, advantages))
    pairs = zip(fused.model.named_parameters(), default.model.parameters(), strict=True)
    moved = 0
    for (name, a), b in pairs:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
        moved += not torch.equal(a, initial[name])
    assert moved


def test_optimizer_state_from_before_the_fused_kernel_keeps_it(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """A checkpoint whose param groups say ``fused: None`` (written before the fused kernel)
    must not turn it off for the resumed run (``load_state_dict`` copies group settings)."""
    old = Trainer.from_pretrained(tiny_llama_dir, FAST)
    for group in old.optimizer.param_groups:
        group["fused"] = None
    samples = _on_policy(old, make_samples(3, seed=11))
    old.train_step(scored_samples(samples, [1.0, -1.0, 0.5]))
    ckpt = tmp_path / "ckpt"
    old.save_checkpoint(ckpt, include_optimizer=True)
    assert torch.load(ckpt / "optimizer.pt", weights_only=True)["optimizer"]["param_groups"][0]["fused"] is None

    resumed = Trainer.from_pretrained(ckpt, FAST)
    resumed.load_optimizer_state(ckpt)
    assert all(g["fused"] is True for g in resumed.optimizer.param_groups)
    old.train_step(scored_samples(samples, [0.5, 0.5, -1.0]))
    resumed.train_step(scored_samples(samples, [0.5, 0.5, -1.0]))  # fused, on the loaded moments
    pairs = zip(old.model.named_parameters(), resumed.model.parameters(), strict=True)
    for (name, a), b in pairs:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_save_checkpoint_rejects_missing_tokenizer(tiny_llama_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_llama_dir, FAST)
    with pytest.raises(FileNotFoundError, match="tokenizer_dir"):
        trainer.save_checkpoint(tmp_path / "ckpt", tmp_path / "missing")
    assert not (tmp_path / "ckpt").exists()
    assert list(tmp_path.iterdir()) == []


def test_threads_are_asked_before_every_micro_batch_and_step_and_restored(tiny_llama_dir: Path) -> None:
    # A fully async update that starts beside generation (1 thread) and goes on alone (2): the
    # count asked for is in force for what follows, the same numbers come out, and the thread
    # count of the caller is back at the end.
    cfg = attrs.evolve(FAST, num_minibatches=2, micro_batch_size=2)
    samples = make_samples(4, seed=5)
    advantages = [1.0, -1.0, 1.0, -1.0]
    before = torch.get_num_threads()
    seen: list[int] = []
    answers = iter([1, 2, 1, 2, 1, 2, 2, 2, 2, 2])

    def threads() -> int:
        seen.append(torch.get_num_threads())
        return next(answers)

    paced = Trainer.from_pretrained(tiny_llama_dir, cfg).train_step(scored_samples(samples, advantages), threads=threads)
    assert torch.get_num_threads() == before
    plain = Trainer.from_pretrained(tiny_llama_dir, cfg).train_step(scored_samples(samples, advantages))
    # 2 old-logprob micro-batches, then per minibatch 1 micro-batch and 1 optimizer step
    assert len(seen) == 2 + 2 * (1 + 1)
    assert seen[1:] == [1, 2, 1, 2, 1]  # each count was in force when the next was asked for
    assert paced.num_optimizer_steps == plain.num_optimizer_steps == 2
    assert paced.loss == pytest.approx(plain.loss, rel=1e-5)
    assert paced.grad_norm == pytest.approx(plain.grad_norm, rel=1e-4)
