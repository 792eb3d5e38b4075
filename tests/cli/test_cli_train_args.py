"""``python -m relaxtrio train`` flags: each algorithm flag reaches its config field; bad
combinations are refused before anything loads, with a message naming the flags."""

from __future__ import annotations

import argparse

import pytest

from relaxtrio._errors import RelaxError
from relaxtrio.cli.train_config import train_config
from relaxtrio.cli.train_flags import add_train_parser


def _config(*flags: str):
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"))
    return train_config(parser.parse_args(["train", *flags]))


def test_defaults_are_plain_grpo_with_token_mean_ppo() -> None:
    cfg = _config()
    assert cfg.rollout.advantage_estimator == "grpo" and cfg.rollout.grpo_std_normalization
    t = cfg.trainer_config
    assert (t.policy_ratio, t.loss_aggregation, t.normalize_advantages) == ("token", "token_mean", False)
    assert not (t.use_tis or t.use_icepop or t.use_opsm or t.use_kl_loss or t.use_dynamic_batch_size)
    assert t.clip_ratio_c is None and t.kl_coef == 0.0 and t.entropy_coef == 0.0


@pytest.mark.parametrize(
    ("flags", "field", "value"),
    [
        (["--normalize-advantages"], "normalize_advantages", True),
        (["--eps-clip-c", "3"], "clip_ratio_c", 3.0),
        (["--policy-ratio", "sequence"], "policy_ratio", "sequence"),
        (["--loss-aggregation", "sequence_sum_norm"], "loss_aggregation", "sequence_sum_norm"),
        (["--loss-norm-tokens", "512"], "loss_norm_tokens", 512),
        (["--use-rollout-logprobs"], "use_rollout_logprobs_as_old", True),
        (["--use-tis"], "use_tis", True),
        (["--use-tis", "--tis-clip", "1.5"], "tis_clip", 1.5),
        (["--use-tis", "--tis-clip-low", "0.1"], "tis_clip_low", 0.1),
        (["--use-icepop"], "use_icepop", True),
        (["--use-icepop", "--icepop-low", "0.3"], "icepop_low", 0.3),
        (["--use-icepop", "--icepop-high", "4"], "icepop_high", 4.0),
        (["--use-opsm"], "use_opsm", True),
        (["--use-opsm", "--opsm-delta", "0.01"], "opsm_delta", 0.01),
        (["--partial-rollout", "--mask-offpolicy-in-partial-rollout"],
         "mask_offpolicy_in_partial_rollout", True),
        (["--entropy-coef", "0.01"], "entropy_coef", 0.01),
        (["--use-kl-loss"], "use_kl_loss", True),
        (["--use-kl-loss", "--kl-loss-coef", "0.05"], "kl_loss_coef", 0.05),
        (["--use-kl-loss", "--kl-loss-type", "low_var_kl"], "kl_loss_type", "low_var_kl"),
        (["--advantage-estimator", "rloo", "--kl-coef", "0.02"], "kl_coef", 0.02),
        (["--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096"], "max_tokens_per_gpu", 4096),
        (["--use-dynamic-batch-size", "--max-tokens-per-gpu", "64"], "use_dynamic_batch_size", True),
    ],
)
def test_each_flag_reaches_its_train_config_field(flags, field, value) -> None:
    assert getattr(_config(*flags).trainer_config, field) == value


def test_estimator_flags_reach_the_rollout_config() -> None:
    cfg = _config("--advantage-estimator", "dr_grpo", "--disable-grpo-std-normalization")
    assert cfg.rollout.advantage_estimator == "dr_grpo"
    assert cfg.rollout.grpo_std_normalization is False


def test_estimators_imply_their_trainer_side() -> None:
    rpp = _config("--advantage-estimator", "reinforce_plus_plus_baseline").trainer_config
    assert rpp.normalize_advantages  # REINFORCE++-baseline's batch normalization
    gspo = _config("--advantage-estimator", "gspo").trainer_config
    assert gspo.policy_ratio == "sequence"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--advantage-estimator", "rloo", "--agentic-custom-advantage-path",
          "tests.support.credit.outcome_times_usefulness"],
         "--advantage-estimator rloo cannot be combined with --agentic-custom-advantage-path"),
        (["--advantage-estimator", "reinforce_plus_plus_baseline", "--agentic-custom-advantage-path",
          "tests.support.credit.outcome_times_usefulness"],
         "reinforce_plus_plus_baseline cannot be combined"),
        (["--kl-coef", "0.1"], "--advantage-estimator grpo does not build returns"),
        (["--advantage-estimator", "rloo", "--kl-coef", "0.1", "--use-kl-loss", "--kl-loss-coef", "0.1"],
         "penalize the same reference KL twice"),
        (["--kl-loss-coef", "0.1"], "--kl-loss-coef has no effect without --use-kl-loss"),
        (["--use-tis", "--use-icepop"], "choose one"),
        (["--use-tis", "--use-rollout-logprobs"], "with rollout logprobs as the old policy"),
        (["--use-tis", "--tis-clip", "1", "--tis-clip-low", "2"], "--tis-clip-low 2 must be <= --tis-clip 1"),
        (["--use-icepop", "--icepop-low", "5", "--icepop-high", "5"], "--icepop-low 5 must be < --icepop-high 5"),
        (["--mask-offpolicy-in-partial-rollout"], "requires --partial-rollout"),
        (["--use-dynamic-batch-size"], "--use-dynamic-batch-size needs --max-tokens-per-gpu"),
        (["--eps-clip-c", "1"], "--eps-clip-c must be a finite number > 1"),
        (["--entropy-coef", "-1"], "--entropy-coef must be a finite number >= 0"),
        (["--max-tokens-per-gpu", "0"], "--max-tokens-per-gpu must be a positive integer, got 0"),
        (["--loss-norm-tokens", "0"], "--loss-norm-tokens must be a positive integer, got 0"),
        (["--eval-interval", "1"], "--eval-interval needs --eval-prompt-data NAME PATH"),
    ],
)
def test_bad_combinations_are_refused_at_startup(flags, message) -> None:
    with pytest.raises(RelaxError, match=message.replace("(", r"\(")):
        _config(*flags)


def test_custom_advantage_starts_without_dynamic_batching() -> None:
    """Issue 34, contradiction 4: a single-context recipe with custom advantage needs no dynamic
    batching, so start-up accepts it; the refusal waits for the first multi-context export."""
    path = "tests.support.credit.outcome_times_usefulness"
    cfg = _config("--agentic-custom-advantage-path", path)
    assert cfg.rollout.custom_advantage is not None and not cfg.train.use_dynamic_batch_size
    cfg.train.refuse_multi_context(1, rollout_id=0)  # one context per Session: trains
    with pytest.raises(RelaxError, match="must also enable dynamic batching") as info:
        cfg.train.refuse_multi_context(3, rollout_id=2)
    assert "rollout 2: a Session exported 3 contexts" in str(info.value)
    assert "docs/export-and-credit.md#multi-context-dynamic-batching" in str(info.value)
    assert "--use-dynamic-batch-size --max-tokens-per-gpu N" in str(info.value)
    cfg = _config("--agentic-custom-advantage-path", path, "--use-dynamic-batch-size",
                  "--max-tokens-per-gpu", "8192")
    cfg.train.refuse_multi_context(3, rollout_id=0)


def test_reward_and_filter_flags_reach_the_rollout_config() -> None:
    from relaxtrio.rollout.filters import check_reward_nonzero_std

    cfg = _config("--custom-rm-path", "tests.support.rewards.group_rank_reward", "--group-rm",
                  "--eval-reward-key", "accuracy", "--log-passrate", "--reward-key", "score",
                  "--dynamic-sampling-filter-path", "relaxtrio.rollout.filters.check_reward_nonzero_std")
    r = cfg.rollout
    assert r.group_rm and r.log_passrate and r.eval_reward_key == "accuracy" and r.reward_key == "score"
    assert r.dynamic_filter is check_reward_nonzero_std and r.custom_rm is not None


def test_group_rm_needs_a_reward_model() -> None:
    with pytest.raises(RelaxError, match="--group-rm needs --custom-rm-path"):
        _config("--group-rm")
    with pytest.raises(RelaxError, match="--dynamic-sampling-filter-path: cannot import"):
        _config("--dynamic-sampling-filter-path", "no_such_module_xyz.fn")


def test_lora_flags_reach_the_train_config() -> None:
    t = _config("--lora-rank", "8", "--lora-alpha", "16", "--lora-target-modules", "q_proj", "v_proj").train
    assert (t.lora_rank, t.lora_alpha, t.lora_target_modules) == (8, 16.0, ("q_proj", "v_proj"))
    assert _config().train.lora_rank == 0
    with pytest.raises(RelaxError, match="--lora-rank must be an int >= 0"):
        _config("--lora-rank", "-2")


def test_lora_run_checkpoints_are_refused(tmp_path) -> None:
    with pytest.raises(RelaxError, match="--lora-rank cannot be combined with --save / --load"):
        _config("--lora-rank", "4", "--save", str(tmp_path / "ckpt"))


def test_engine_restarts_reach_the_fleet_config_and_refuse_a_negative_count() -> None:
    assert _config().fleet.engine_restarts == 3
    assert _config("--engine-restarts", "0").fleet.engine_restarts == 0
    with pytest.raises(RelaxError, match="--engine-restarts must be >= 0"):
        _config("--engine-restarts", "-1")


def test_first_request_timeout_flag_reaches_the_agent_config() -> None:
    assert _config().agent.first_request_timeout_s == 600.0
    assert _config("--agent-first-request-timeout", "30").agent.first_request_timeout_s == 30.0
    assert _config("--agent-first-request-timeout", "0").agent.first_request_timeout_s is None
    with pytest.raises(RelaxError, match="--agent-first-request-timeout must be a positive number"):
        _config("--agent-first-request-timeout", "-5")


def test_a_model_directory_without_config_or_tokenizer_is_refused_naming_the_flag(tmp_path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(RelaxError, match="is not a Hugging Face model directory .no config.json."):
        _config("--hf-checkpoint", str(model))
    (model / "config.json").write_text("{}")
    with pytest.raises(RelaxError, match=r"--hf-checkpoint '.*model' has no tokenizer \(none of "
                                         r"tokenizer.json, tokenizer.model, vocab.json"):
        _config("--hf-checkpoint", str(model))


def test_stop_token_ids_outside_the_vocabulary_are_refused_at_startup(tiny_model_dir) -> None:
    """Every turn would fail at the engine (the tiny model's vocabulary has 1536 ids)."""
    with pytest.raises(RelaxError, match=r"--rollout-stop-token-ids 1536 99999: not token ids of "
                                         r"--hf-checkpoint \(its vocabulary is \[0, 1536\)\)"):
        _config("--hf-checkpoint", str(tiny_model_dir), "--rollout-stop-token-ids", "7", "1536", "99999")
    config = _config("--hf-checkpoint", str(tiny_model_dir), "--rollout-stop-token-ids", "7", "1535")
    assert config.generation.stop_token_ids == (7, 1535)


def test_a_hook_with_a_wrong_signature_stops_startup_and_relax_hooks_get_the_command_line() -> None:
    with pytest.raises(RelaxError, match=r"--dynamic-sampling-filter-path: three_arguments\(a, b, c\) does not "
                                         r"fit the dynamic filter hook; expected fn\(samples, rewards\) or "
                                         r"fn\(args, samples\) \(Relax\)"):
        _config("--dynamic-sampling-filter-path", "tests.support.rewards.three_arguments")
    cfg = _config("--custom-rm-path", "tests.support.rewards.relax_reward", "--reward-key", "score")
    assert cfg.rollout.hook_args.reward_key == "score"  # Relax's `args`: the parsed command line
