"""The ``train`` / ``rollout`` flags (:mod:`relaxtrio.cli.train_flags`) checked and translated into
a :class:`~relaxtrio.config.TrainRunConfig`.

Every check that can be made before loading a model is made here, so a mistake costs a second and
gives one line naming the flag, not a traceback after minutes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from .._errors import ConfigError
from .._validate import is_real
from ..config import (
    AgentConfig,
    ApiConfig,
    EvalConfig,
    FleetConfig,
    GenerationConfig,
    RolloutConfig,
    TrackerConfig,
    TrainRunConfig,
)
from ..cpu_threads import MAX_THREADS
from ..nursery.agent import parse_agent_env
from ..rollout.dumps import check_dump_template
from ..rollout.hooks import HookKind, load_hook
from ..run.trackers import check_trackers_installed
from .algorithm_flags import train_section
from .cluster_flags import with_cluster_flags
from .tool_flags import check_model_dir, tracing_config

__all__ = ["train_config"]


def train_config(args: argparse.Namespace) -> TrainRunConfig:
    """Validates the flags and builds the :class:`~relaxtrio.config.TrainRunConfig`.

    Raises:
        ConfigError: any invalid flag, with a message naming it (``param`` is the flag when
            the check belongs to one config field).
    """
    _check_flags(args)
    _check_file(args.prompt_data, "--prompt-data")
    eval_sets = _eval_sets(args)
    agent = AgentConfig(command=args.agent_command, cwd=args.agent_cwd.resolve(),
                        env=parse_agent_env(args.agent_env), timeout_s=args.agent_timeout,
                        first_request_timeout_s=args.agent_first_request_timeout or None,
                        export_policy=args.agentic_export_policy)
    train = train_section(args)
    config = TrainRunConfig(
        prompt_data=args.prompt_data, input_key=args.input_key, metadata_key=args.metadata_key,
        num_rollout=args.num_rollout, multimodal_keys=args.multimodal_keys,
        rollout=_rollout_section(args),
        eval=EvalConfig(datasets=eval_sets, interval=args.eval_interval,
                        agentic_eval_concurrency=args.agentic_eval_concurrency,
                        max_context_tokens=args.eval_max_context_len),
        agent_external_slots=args.agent_external_slots,
        skip_capacity_check=args.skip_capacity_check,
        generation=_generation_section(args),
        agent=agent,
        api=ApiConfig(strict_request_fields=args.agentic_strict_request_fields),
        train=train,
        hf_checkpoint=args.hf_checkpoint,
        fleet=_fleet_section(args),
        engine_args=("--max-running-requests", str(args.engine_max_running_requests)),
        trainer_num_threads=args.trainer_num_threads,
        engine_num_threads=args.engine_num_threads,
        output_dir=args.output_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"),
        rollout_shuffle=args.rollout_shuffle,
        seed=args.rollout_seed,
        rollout_only=args.debug_rollout_only,
        samples_path=args.rollout_samples_path,
        debug_rollout_data=(check_dump_template(args.save_debug_rollout_data)
                            if args.save_debug_rollout_data is not None else None),
        operator_port=args.operator_port,
    )
    return with_cluster_flags(_with_checkpoint_flags(config, args), args)


def _hook(path: str | None, flag: str, kind: HookKind) -> Callable[..., Any] | None:
    return load_hook(path, flag=flag, kind=kind) if path else None


def _rollout_section(args: argparse.Namespace) -> RolloutConfig:
    return RolloutConfig(
        n_samples_per_prompt=args.n_samples_per_prompt,
        rollout_batch_size=args.rollout_batch_size,
        over_sampling_batch_size=args.over_sampling_batch_size,
        agentic_concurrency=args.agentic_concurrency,
        prelaunch=args.agentic_prelaunch,
        partial_rollout=args.partial_rollout,
        fully_async=args.fully_async,
        max_staleness=args.max_staleness,
        barrier_warn_s=args.barrier_warn_s,
        reward_key=args.reward_key,
        eval_reward_key=args.eval_reward_key,
        group_rm=args.group_rm,
        log_passrate=args.log_passrate,
        dynamic_filter=_hook(args.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path",
                             "dynamic_filter"),
        advantage_estimator=args.advantage_estimator,
        grpo_std_normalization=not args.disable_grpo_std_normalization,
        custom_rm=_hook(args.custom_rm_path, "--custom-rm-path",
                        "group_reward" if args.group_rm else "reward"),
        custom_advantage=_hook(args.agentic_custom_advantage_path, "--agentic-custom-advantage-path",
                               "custom_advantage"),
        hook_args=args,
    )


def _generation_section(args: argparse.Namespace) -> GenerationConfig:
    return GenerationConfig(
        temperature=args.rollout_temperature,
        top_p=args.rollout_top_p,
        top_k=args.rollout_top_k,
        max_response_tokens=args.rollout_max_response_len,
        max_context_tokens=args.rollout_max_context_len,
        stop=tuple(args.rollout_stop),
        stop_token_ids=tuple(args.rollout_stop_token_ids),
        tool_call_parser=args.agentic_tool_call_parser,
        reasoning_parser=args.agentic_reasoning_parser,
        text_only_images=args.agentic_text_only_images,
        template_kwargs=dict(args.apply_chat_template_kwargs),
        partial_rollout_max_aborted_count=(
            args.partial_rollout_max_aborted_count if args.partial_rollout else None),
    )


def _fleet_section(args: argparse.Namespace) -> FleetConfig:
    return FleetConfig(
        router_url=args.sglang_router_url,
        engine_urls=tuple(args.engine_urls),
        num_engines=_num_engines(args),
        num_gpus=args.rollout_num_gpus,
        num_gpus_per_engine=args.rollout_num_gpus_per_engine,
        sglang_args=tuple(getattr(args, "sglang_args", ())),
        min_healthy_engines=args.min_healthy_engines,
        engine_restarts=args.engine_restarts,
        weights_dir=args.weights_dir,
        weight_sync=args.weight_sync,
        session_lifecycle=args.agentic_session_lifecycle,
        backend=args.rollout_backend,
        engine_python=args.engine_python,
    )


def _tracker_section(args: argparse.Namespace, output_dir: Path) -> TrackerConfig:
    """The trackers of the observability flags, under the run directory ``output_dir``.

    Raises:
        ConfigError: a tracker was asked for whose package is not installed.
    """
    cfg = TrackerConfig(
        tensorboard_dir=(args.tensorboard_dir or output_dir / "tensorboard") if args.use_tensorboard else None,
        wandb_dir=(args.wandb_dir or output_dir) if args.use_wandb else None,
        wandb_project=args.wandb_project, wandb_mode=args.wandb_mode,
        wandb_run_name=args.wandb_run_name,
    )
    check_trackers_installed(cfg)
    return cfg


def _with_checkpoint_flags(config: TrainRunConfig, args: argparse.Namespace) -> TrainRunConfig:
    """``config`` with the checkpoint/resume flags applied (and the trackers, which live in the
    run directory a resume may pick).

    Raises:
        ConfigError: ``--save-interval`` below 1 or without ``--save``; an unreadable checkpoint;
            a ``--load`` / ``--save`` pair :func:`~relaxtrio.run.run_dirs.check_checkpoint_dirs`
            refuses.
    """
    _need(args.save_interval is None or args.save_interval >= 1, "--save-interval must be >= 1")
    _need(args.save_interval is None or args.save is not None, "--save-interval needs --save DIR")
    _need(not (args.debug_rollout_only and (args.save is not None or args.load is not None)),
          "--save and --load checkpoint training; a rollout-only run trains nothing to checkpoint")
    output_dir = config.output_dir
    if args.load is not None or args.save is not None:
        from ..run.run_dirs import check_checkpoint_dirs

        check_checkpoint_dirs(args.load, args.save)
    if args.load is not None and args.output_dir is None:
        from ..run.run_dirs import find_resume_point, forks_run

        resume = find_resume_point(args.load, log_missing=False)  # the driver logs it
        if resume is not None and resume.output_dir is not None and not forks_run(args.load, args.save):
            output_dir = resume.output_dir  # a fork (another --save) gets a run directory of its own
    generation = config.generation
    if args.sglang_enable_deterministic_inference:
        generation = attrs.evolve(generation, seed=args.rollout_seed, seed_per_sample=True)
    return attrs.evolve(config, save_dir=args.save, save_interval=args.save_interval,
                        load_dir=args.load, output_dir=output_dir, generation=generation,
                        trackers=_tracker_section(args, output_dir), tracing=tracing_config(args))


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_file(path: Path, flag: str) -> Path:
    _need(path.is_file(), f"{flag} {str(path)!r} is not a readable file")
    return path


def _check_flags(args: argparse.Namespace) -> None:
    _need(args.num_rollout >= 1, "--num-rollout must be >= 1")
    _check_fleet_flags(args)
    for flag in ("n_samples_per_prompt", "rollout_batch_size", "rollout_max_response_len",
                 "engine_max_running_requests"):
        _need(getattr(args, flag) >= 1, f"--{flag.replace('_', '-')} must be >= 1")
    for flag in ("agentic_concurrency", "agentic_eval_concurrency", "over_sampling_batch_size",
                 "partial_rollout_max_aborted_count", "rollout_max_context_len", "eval_max_context_len",
                 "agent_external_slots"):
        value = getattr(args, flag)
        _need(value is None or value >= 1, f"--{flag.replace('_', '-')} must be >= 1")
    _need(args.max_staleness is None or args.max_staleness >= 0, "--max-staleness must be >= 0")
    for flag in ("engine_num_threads", "trainer_num_threads"):
        value = getattr(args, flag)
        _need(value is None or 0 <= value <= MAX_THREADS,
              f"--{flag.replace('_', '-')} must be between 0 and {MAX_THREADS}")
    _need(args.over_sampling_batch_size is None or args.over_sampling_batch_size >= args.rollout_batch_size,
          "--over-sampling-batch-size must be >= --rollout-batch-size")
    _need(is_real(args.rollout_temperature) and args.rollout_temperature >= 0,
          "--rollout-temperature must be a finite number >= 0")
    _need(0 < args.rollout_top_p <= 1, "--rollout-top-p must be in (0, 1]")
    _need(args.rollout_top_k == -1 or args.rollout_top_k >= 1, "--rollout-top-k must be -1 (off) or >= 1")
    _need(args.eval_interval >= 0, "--eval-interval must be >= 0 (0: never)")
    _need(is_real(args.barrier_warn_s) and args.barrier_warn_s > 0,
          "--barrier-warn-s must be a positive number of seconds")
    _need(not (args.partial_rollout and args.fully_async),
          "--partial-rollout and --fully-async are mutually exclusive")
    _need(args.agentic_export_policy != "all-leaves" or args.agentic_custom_advantage_path is not None,
          "--agentic-export-policy all-leaves exports several contexts per Session and needs "
          "--agentic-custom-advantage-path")
    mm = args.multimodal_keys
    _need(mm is None or all(isinstance(k, str) and isinstance(v, str) for k, v in mm.items()),
          '--multimodal-keys must map strings to strings, e.g. {"image": "images"}')
    _need(len(args.eval_prompt_data) % 2 == 0, "--eval-prompt-data takes NAME PATH pairs")
    _need(args.operator_port is None or 0 <= args.operator_port <= 65535,
          "--operator-port must be in [0, 65535]")
    _need(not (args.eval_interval and not args.eval_prompt_data),
          "--eval-interval needs --eval-prompt-data NAME PATH (nothing to evaluate)")
    if args.hf_checkpoint is not None:
        check_model_dir(args.hf_checkpoint)
        vocab = _vocab_size(args.hf_checkpoint)
        outside = [i for i in args.rollout_stop_token_ids if vocab is not None and not 0 <= i < vocab]
        _need(not outside, f"--rollout-stop-token-ids {' '.join(map(str, outside))}: not token ids "
                           f"of --hf-checkpoint (its vocabulary is [0, {vocab}))")


def _vocab_size(model_dir: Path) -> int | None:
    """``vocab_size`` of a model directory's ``config.json`` (a vision model's ``text_config``),
    or None when it names none."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except ValueError:
        return None  # transformers reports a broken config.json when it loads the model
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return size if isinstance(size, int) else None


def _check_fleet_flags(args: argparse.Namespace) -> None:
    _need(not (args.sglang_router_url and args.engine_urls),
          "give --sglang-router-url or --engine-url, not both")
    for flag in ("rollout_num_engines", "rollout_num_gpus"):
        value = getattr(args, flag)
        _need(value is None or value >= 1, f"--{flag.replace('_', '-')} must be >= 1")
    for flag in ("rollout_num_gpus_per_engine", "min_healthy_engines"):
        _need(getattr(args, flag) >= 1, f"--{flag.replace('_', '-')} must be >= 1")
    _need(args.engine_restarts >= 0, "--engine-restarts must be >= 0")
    connected = bool(args.sglang_router_url or args.engine_urls)
    _need(not (connected and (args.rollout_num_engines or args.rollout_num_gpus)),
          "--rollout-num-engines / --rollout-num-gpus launch engines; they cannot be combined "
          "with --sglang-router-url or --engine-url")
    engines = _num_engines(args)
    if args.rollout_num_gpus is not None:
        _need(args.rollout_num_gpus >= args.rollout_num_gpus_per_engine,
              f"--rollout-num-gpus {args.rollout_num_gpus} is fewer than "
              f"--rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine}")
    if not connected:
        _need(args.min_healthy_engines <= engines,
              f"--min-healthy-engines {args.min_healthy_engines} is more than the {engines} "
              "launched engine(s)")


def _num_engines(args: argparse.Namespace) -> int:
    if args.rollout_num_engines is not None:
        return args.rollout_num_engines
    if args.rollout_num_gpus is not None:
        return max(args.rollout_num_gpus // args.rollout_num_gpus_per_engine, 1)
    return 1


def _eval_sets(args: argparse.Namespace) -> tuple[tuple[str, Path, int], ...]:
    """``(name, path, n_samples_per_eval_prompt)`` per ``--eval-prompt-data`` pair.

    Raises:
        ConfigError: a missing file, or a bad ``--n-samples-per-eval-prompt`` count.
    """
    names_paths = [(args.eval_prompt_data[i], _check_file(Path(args.eval_prompt_data[i + 1]), "--eval-prompt-data"))
                   for i in range(0, len(args.eval_prompt_data), 2)]
    sizes = args.n_samples_per_eval_prompt
    _need(len(sizes) in (1, max(len(names_paths), 1)) and min(sizes) >= 1,
          "--n-samples-per-eval-prompt takes one value >= 1, or one per eval dataset")
    return tuple((name, path, sizes[i] if len(sizes) > 1 else sizes[0])
                 for i, (name, path) in enumerate(names_paths))
