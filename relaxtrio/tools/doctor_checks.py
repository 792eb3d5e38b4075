"""The contract checks of ``python -m relaxtrio doctor``: what one agent run showed → pass/fail/skip.

Pure: :func:`evaluate` reads an :class:`Observation` (filled by :mod:`relaxtrio.tools.doctor`) and
returns one :class:`Check` per contract step, each failure with what went wrong and the fix.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from .._errors import ExportError
from ..forest import ObservationNode, ResponseNode, SessionForest, TrainingSample
from ..rollout.advantages import scalar_reward

CheckStatus = Literal["pass", "warn", "fail", "skip"]

MODEL_ENDPOINTS = "chat/completions, responses or messages (v1/ in front is optional) under RELAX_BASE_URL"
_NOT_FOUND_EXIT_CODES = (126, 127)  # bash: found but not executable / command not found


@attrs.frozen
class Check:
    """One contract step's verdict.

    Attributes:
        name: the step (``starts``, ``first_request``, ...).
        status: ``pass``, ``warn`` (works, but a run will suffer: not a failure), ``fail``, or
            ``skip`` (an earlier failure left nothing to check).
        detail: what was seen (on a failure or warning: what went wrong).
        fix: what to change, on a failure or warning.
    """

    name: str
    status: CheckStatus
    detail: str
    fix: str = ""


@attrs.frozen(kw_only=True)
class RequestRecord:
    """One HTTP request the agent made.

    Attributes:
        method: HTTP method.
        path: request path.
        status: the HTTP status it was answered with.
        supported: whether a route of the API served the path (False: 404/405 for the path).
        client_timeout_s: the read timeout the client announced in its SDK header, or None.
        retry_count: the SDK's retry counter header (0 for a first attempt or no header).
        error: the start of a 4xx/5xx answer's body (its error message), ``""`` otherwise.
    """

    method: str
    path: str
    status: int
    supported: bool
    client_timeout_s: float | None = None
    retry_count: int = 0
    error: str = ""


@attrs.define(kw_only=True)
class Observation:
    """What one doctor run saw of the agent.

    Attributes:
        log_path: the agent's whole log.
        started: whether the process started.
        start_error: why it could not be started, or None.
        requests: every HTTP request it made, in answer order.
        first_request_s: seconds from the start to its first request, or None.
        no_request_in_time: the first-request limit passed and the agent was stopped.
        return_code: its exit code (None: stopped, timed out or not started).
        timed_out: it ran out of active time.
        output_text: RELAX_OUTPUT_JSON's text, or None when not written.
        output_error: why the output is unusable, or None.
        export_error: why the export failed, or None.
        explicit_records: how many explicit export records the output held (0: implicit).
        samples: the exported contexts.
        forest: the Session's forest.
        max_context_tokens: the context window the Session had, or None when unknown.
        first_output_tokens: the output limit the agent's first model request asked for (None:
            it set none, or there was no request).
        first_prompt_tokens: that request's prompt in tokens, or None when unknown.
    """

    log_path: Path
    started: bool = False
    start_error: str | None = None
    requests: list[RequestRecord] = attrs.field(factory=list)
    first_request_s: float | None = None
    no_request_in_time: bool = False
    return_code: int | None = None
    timed_out: bool = False
    output_text: str | None = None
    output_error: str | None = None
    export_error: str | None = None
    explicit_records: int = 0
    samples: list[TrainingSample] = attrs.field(factory=list)
    forest: SessionForest | None = None
    max_context_tokens: int | None = None
    first_output_tokens: int | None = None
    first_prompt_tokens: int | None = None


def _skip(name: str, why: str) -> Check:
    return Check(name, "skip", why)


def _starts(obs: Observation) -> Check:
    if obs.start_error is not None:
        return Check("starts", "fail", f"the agent could not be started: {obs.start_error}",
                     "check --agent-command and --agent-cwd (the command runs as bash -lc CMD in --agent-cwd)")
    if _command_not_run(obs):
        return Check("starts", "fail",
                     f"bash could not run the command (exit code {obs.return_code}: not found or not "
                     "executable)",
                     "use a command that works from --agent-cwd in a login shell (bash -lc); prefer "
                     "absolute paths, a login shell resets PATH")
    return Check("starts", "pass", "the agent process started")


def _command_not_run(obs: Observation) -> bool:
    """bash could not run the command (exit 126/127 before any request)."""
    return not obs.requests and obs.return_code in _NOT_FOUND_EXIT_CODES


def _first_request(obs: Observation, limit_s: float) -> Check:
    fix = ("call the model at RELAX_BASE_URL with RELAX_SESSION_ID as the API key; read the task from "
           "RELAX_INPUT_JSON")
    if obs.first_request_s is not None:
        return Check("first_request", "pass", f"first request after {obs.first_request_s:.1f} s")
    if _command_not_run(obs):
        return _skip("first_request", "the command did not run (see starts)")
    if obs.no_request_in_time:
        return Check("first_request", "fail",
                     f"no request reached the API within {limit_s:g} s (the agent was stopped); in a "
                     "training run its whole Group waits at the first-request barrier until "
                     "--agent-first-request-timeout stops it and drops the Group", fix)
    if obs.timed_out:
        return Check("first_request", "fail", "the agent timed out without sending a request", fix)
    if obs.return_code:
        return Check("first_request", "fail",
                     f"the agent exited (code {obs.return_code}) without sending a request",
                     "it failed before calling the model: read its output tail below (a "
                     "ModuleNotFoundError usually means the command runs another Python than "
                     "the agent's environment: name that interpreter by absolute path)")
    return Check("first_request", "fail",
                 f"the agent exited (code {obs.return_code}) without sending a request", fix)


def _endpoint(obs: Observation) -> Check:
    if not obs.requests:
        return _skip("endpoint", "no request to check")
    wrong = [r for r in obs.requests if not r.supported]
    if wrong:
        r = wrong[0]
        return Check("endpoint", "fail",
                     f"{r.method} {r.path} is not an endpoint relaxtrio serves (HTTP {r.status}); "
                     f"{len(wrong)} of {len(obs.requests)} requests went to unserved paths",
                     f"send model requests to {MODEL_ENDPOINTS} (base URL ending in /agentic_api/)")
    denied = [r for r in obs.requests if r.status == 401]
    if denied:
        return Check("endpoint", "fail", f"{denied[0].method} {denied[0].path} was refused (HTTP 401)",
                     "send RELAX_SESSION_ID as the API key (Authorization: Bearer or x-api-key)")
    tool_search = [r for r in obs.requests if r.status == 400 and "ENABLE_TOOL_SEARCH" in r.error]
    if tool_search:
        return Check("endpoint", "fail",
                     f"{len(tool_search)} request(s) sent deferred tools (Claude Code's tool search) and "
                     "got a 400: relaxtrio does not serve tool search",
                     "set ENABLE_TOOL_SEARCH=false in the agent's environment (examples/claude_code does)")
    paths = sorted({r.path for r in obs.requests})
    return Check("endpoint", "pass", f"{len(obs.requests)} requests to {', '.join(paths)}")


def _client_timeout(obs: Observation, min_s: float) -> Check:
    if not obs.requests:
        return _skip("client_timeout", "no request to check")
    fix = (f"give the client a read timeout of at least {min_s:g} s (openai: OpenAI(timeout=1800, "
           "max_retries=0); anthropic: Anthropic(timeout=1800)); answers can be held for minutes (the "
           "first-request barrier, partial rollout, a busy engine)")
    short = [r for r in obs.requests if r.client_timeout_s is not None and r.client_timeout_s < min_s]
    if short:
        return Check("client_timeout", "fail",
                     f"the client's read timeout is {short[0].client_timeout_s:g} s (SDK timeout header "
                     f"of {short[0].method} {short[0].path}), shorter than {min_s:g} s", fix)
    retried = _unanswered_retries(obs.requests)
    if retried:
        return Check("client_timeout", "fail",
                     f"the client retried {retried[0].method} {retried[0].path} (retry "
                     f"{retried[0].retry_count}): it gave up waiting for an answer", fix)
    seen = [r.client_timeout_s for r in obs.requests if r.client_timeout_s is not None]
    if not seen:
        return Check("client_timeout", "pass",
                     f"not announced by the client (no SDK timeout header); make sure it waits >= {min_s:g} s")
    return Check("client_timeout", "pass", f"read timeout {min(seen):g} s")


RETRYABLE_STATUSES: Final = frozenset({408, 409, 429})
"""Statuses below 500 that the openai and anthropic SDKs retry (they retry every 5xx too)."""


def _output_room(obs: Observation) -> Check:
    """Warns when the first request asks for more output than the window leaves after its prompt:
    the harness then sizes the context for a larger model, never compacts in time and runs into
    the limit (docs/agent-contract.md#environment-variables)."""
    if obs.first_prompt_tokens is None:
        return _skip("output_room", "no model request to check")
    window, asked, prompt = obs.max_context_tokens, obs.first_output_tokens, obs.first_prompt_tokens
    if window is None or asked is None:
        return Check("output_room", "pass", "the request set no output limit, or the window is unknown")
    room = window - prompt
    if asked <= room:
        return Check("output_room", "pass", f"asks for {asked} output tokens; {room} left in the window")
    return Check("output_room", "warn",
                 f"the first request asks for {asked} output tokens but the {window}-token window leaves "
                 f"{room} after its {prompt} prompt tokens: the harness takes the model for a larger one "
                 "(it compacts too late and runs into the limit)",
                 "size the harness from RELAX_MAX_CONTEXT_TOKENS and RELAX_MAX_RESPONSE_TOKENS (Claude Code: "
                 "CLAUDE_CODE_MAX_CONTEXT_TOKENS, CLAUDE_CODE_MAX_OUTPUT_TOKENS; Codex: model_context_window, "
                 "model_auto_compact_token_limit; opencode: the model's limit.context and limit.output; "
                 "see examples/)")


def _unanswered_retries(requests: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The retried requests whose earlier attempt got no answer: the client gave up waiting.

    An SDK also retries an answer it was given: an empty reply or another 5xx, an overload
    (503/529), a 408/409/429. Requests are in answer order, and an attempt is answered before
    its retry is sent, so each such answer on a method and path explains one later retry there;
    a retry with no such answer before it followed an attempt that was never answered.
    """
    explained: collections.Counter[tuple[str, str]] = collections.Counter()
    unanswered = []
    for r in requests:
        key = (r.method, r.path)
        if r.retry_count > 0:
            if explained[key] > 0:
                explained[key] -= 1
            else:
                unanswered.append(r)
        if r.status >= 500 or r.status in RETRYABLE_STATUSES:
            explained[key] += 1
    return unanswered


def _short(message: dict[str, Any]) -> str:
    text = json.dumps(message.get("content"), ensure_ascii=False)
    return text if len(text) <= 120 else text[:117] + "..."


def _assistant_replay(obs: Observation) -> Check:
    if obs.forest is None or not obs.requests:
        return _skip("assistant_replay", "no request to check")
    nodes = obs.forest.nodes()
    for node in nodes:
        if not isinstance(node, ObservationNode):
            continue
        for message in node.messages:
            if message.get("role") != "assistant":
                continue
            answered = [n.message for n in nodes
                        if isinstance(n, ResponseNode) and n.parent_hash == node.parent_hash]
            was = f"; relaxtrio had answered {_short(answered[0])}" if answered else ""
            return Check("assistant_replay", "fail",
                         f"a request replayed an assistant message that relaxtrio did not answer: sent "
                         f"{_short(message)}{was} (the conversation forked, its earlier turns are not "
                         "trained as one context)",
                         "send every assistant message back exactly as received (content, tool_calls, "
                         "reasoning); do not trim, reformat or rewrite earlier turns")
    return Check("assistant_replay", "pass", "every assistant message came back as answered")


def _exit_code(obs: Observation, agent_timeout_s: float) -> Check:
    if obs.no_request_in_time or not obs.started:
        return _skip("exit_code", "the agent was stopped or never started")
    if _command_not_run(obs):
        return _skip("exit_code", "the command did not run (see starts)")
    if obs.timed_out:
        return Check("exit_code", "fail", f"the agent ran out of its {agent_timeout_s:g} s of active time",
                     "finish within --agent-timeout, or raise it")
    if obs.return_code != 0:
        return Check("exit_code", "fail", f"the agent exited with code {obs.return_code}",
                     "exit 0 once RELAX_OUTPUT_JSON is written (a non-zero exit drops the whole Group); "
                     "see the agent output below")
    return Check("exit_code", "pass", "exited 0")


def _output(obs: Observation) -> Check:
    if obs.return_code != 0 and obs.output_error is None:
        return _skip("output", "the agent did not exit 0")
    if obs.output_error is not None:
        return Check("output", "fail", f"RELAX_OUTPUT_JSON is not usable: {obs.output_error}",
                     'write one JSON object ({"reward": 1.0, "metadata": {...}}) or JSONL export records '
                     "(one JSON object per line)")
    if obs.output_text is None:
        return Check("output", "pass", "no output file: implicit export, no reward")
    return Check("output", "pass", "valid JSON / JSONL")


def _export(obs: Observation) -> Check:
    if obs.return_code != 0 or obs.output_error is not None:
        return _skip("export", "no usable output")
    if obs.export_error is not None:
        return Check("export", "fail", f"the export matches no committed state: {obs.export_error}",
                     "export records must repeat a conversation exactly as it was sent and answered "
                     "(messages, tools, chat_template_kwargs); with one conversation, write no records "
                     "and it is exported implicitly")
    return Check("export", "pass", f"{len(obs.samples)} context(s) exported")


def _reward(obs: Observation, reward_hook: str | None, reward_key: str | None) -> Check:
    if obs.export_error is not None or not obs.samples:
        return _skip("reward", "nothing exported")
    fix = ('write {"reward": <number>} to RELAX_OUTPUT_JSON (or a reward per export record), or '
           "configure --custom-rm-path / --agentic-custom-advantage-path")
    for sample in obs.samples:
        name = "the context" if sample.name is None else f"context {sample.name!r}"
        if sample.reward is None:
            if reward_hook is None:
                return Check("reward", "fail", f"{name} has no reward and no reward hook is configured", fix)
            continue
        try:
            scalar_reward(sample.reward, reward_key)
        except ExportError as exc:
            return Check("reward", "fail", f"{name} has an unusable reward: {exc}", fix)
    how = f" (hook {reward_hook})" if reward_hook and any(s.reward is None for s in obs.samples) else ""
    return Check("reward", "pass", f"reward present{how}")


def evaluate(obs: Observation, *, first_request_s: float, min_client_timeout_s: float,
             agent_timeout_s: float, reward_hook: str | None, reward_key: str | None) -> list[Check]:
    """Every contract check of one agent run, in contract order.

    Args:
        obs: what the run saw.
        first_request_s: the first-request limit in seconds.
        min_client_timeout_s: the shortest acceptable client read timeout in seconds.
        agent_timeout_s: the agent's active-time budget in seconds.
        reward_hook: the configured reward hook's flag, or None.
        reward_key: primary key of object rewards.
    """
    return [
        _starts(obs),
        _first_request(obs, first_request_s),
        _endpoint(obs),
        _client_timeout(obs, min_client_timeout_s),
        _output_room(obs),
        _assistant_replay(obs),
        _exit_code(obs, agent_timeout_s),
        _output(obs),
        _export(obs),
        _reward(obs, reward_hook, reward_key),
    ]
