"""The client of one vLLM server's token-in/token-out RL API (vLLM 0.32, CPU or GPU build).

The server must run with ``VLLM_SERVER_DEV_MODE=1`` (pause, resume, abort, weight routes) and
``--enable-scale-out`` (the token route), and for training with ``--logprobs-mode
processed_logprobs`` (see *Logprobs* below)::

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model DIR \\
        --enable-scale-out --enable-prefix-caching --logprobs-mode processed_logprobs

Routes, as a vLLM 0.32.0 CPU server answered them (reply shapes of generate and errors are in
:mod:`relaxtrio.vllm.wire`):

- ``POST /inference/v1/generate`` ``{"request_id", "token_ids", "sampling_params"}``. The server
  names the request ``generate-tokens-<request_id>``, or ``generate-tokens-<X-Request-Id>`` when
  that header is sent (so this client never forwards one).
- ``POST /abort_requests`` ``{"request_ids": ["generate-tokens-<rid>"]}`` → ``{"status":
  "aborted", "aborted": 1}``; the aborted generate call then returns its partial output with
  ``finish_reason: "abort"``. The count is that of the ids sent, not of requests found: the bare
  rid answers ``"aborted": 1`` too and aborts nothing. An empty body ``{}`` aborts every request.
- ``POST /pause?mode=keep|abort|wait`` → ``{"status": "paused"}``: ``keep`` freezes running
  requests where they are (their calls stay open and continue on resume), ``abort`` ends them
  with partial output, ``wait`` answers once they have finished. While paused, new generate
  calls queue. ``POST /resume`` → ``{"status": "resumed"}``; both are idempotent.
  ``GET /is_paused`` → ``{"is_paused": bool}``. ``GET /health`` answers 200 while paused.
- ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` →
  ``{"results": [null]}`` (about 1.4 s for SmolLM2-135M on 2 loaded cores). It does not touch
  the prefix cache, whose blocks still hold the old weights' keys and values:
  ``POST /reset_prefix_cache?reset_running_requests=true`` → ``{"success": true}`` drops them and
  sends running (or kept) requests back to the queue to recompute theirs on the new weights.
  A failed reload (e.g. a path that is not a checkpoint) answers HTTP 500 and leaves the model
  half-loaded: the next generation crashes the engine process. It is reported as
  :class:`~relaxtrio.EngineUnavailableError`; restart that engine.
- ``POST /update_weight_version`` ``{"new_version": "v1"}`` → ``{"success": true, "new_version":
  "v1"}``; ``GET /weight_info`` → ``{"weight_version": "v1"}`` (``"default"`` at start). Tokens
  generated afterwards carry the new label in their ``weight_versions`` span.
- Model and server info: :mod:`relaxtrio.vllm.info`. vLLM has no sessions (``close_session`` is
  a no-op); :meth:`VllmEngineClient.flush_cache` is ``/reset_prefix_cache``.

**Logprobs.** By default vLLM reports *raw* logprobs: ``log_softmax(logits)`` before penalties and
temperature. relaxtrio's trainer compares them with its own at the sampling temperature
(``log_softmax(logits / T)``, docs/client-quirks.md#logprob-convention), which is what a server
started with ``--logprobs-mode processed_logprobs`` reports (measured against a transformers fp32
forward of SmolLM2: at most 1.8e-5 apart at T = 1.0 and 0.7). One difference stays: vLLM's
processed logprobs come after top-k / top-p truncation (renormalized over the kept tokens), the
embedded engine's before it, so they agree only with ``top_k = -1`` and ``top_p = 1``. Greedy
requests report ``log_softmax(logits)`` in both. :func:`~relaxtrio.vllm.info.logprobs_mode_problem`
tells from :meth:`VllmEngineClient.server_info` whether a server fits.

Errors are mapped as for SGLang (:mod:`relaxtrio.sglang.client`): a 400 naming the context
length is :class:`~relaxtrio.ContextLengthExceededError`, any other 4xx
:class:`~relaxtrio.EngineRejectedError` (this request was refused), a 5xx or a transport failure
:class:`~relaxtrio.EngineUnavailableError`. Transport errors and 5xx are retried as in
:mod:`relaxtrio.sglang._http`, except the weight reload, which is never repeated.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, Final, Literal

import attrs
import httpx
import orjson

from .._errors import (
    EngineRejectedError,
    EngineUnavailableError,
    InvalidRequestError,
    RelaxError,
)
from ..sglang._http import EngineClientConfig, json_object, send_with_retries
from ..sglang._ids_json import IdsJsonEncoder
from ..sglang._pool import ConnectionPool
from ..sglang._replies import GenerateResult
from ..sglang.wire import SamplingParams
from .info import context_token_limit, model_info_from, server_info_from
from .wire import (
    error_from_response,
    parse_generate_response,
    server_request_id,
    vllm_sampling_params,
)

__all__ = [
    "EngineClientConfig",
    "GenerateResult",
    "PauseMode",
    "SamplingParams",
    "VllmEngineClient",
]

PauseMode = Literal["abort", "keep", "wait", "retract", "in_place"]
"""vLLM's modes, plus SGLang's two loss-free ones, which both mean ``keep`` here."""

_VLLM_PAUSE_MODE: Final[dict[str, str]] = {
    "abort": "abort", "keep": "keep", "wait": "wait", "retract": "keep", "in_place": "keep"}
_GENERATE_PATH: Final = "/inference/v1/generate"
_INITIAL_VERSION: Final = "default"  # what vLLM labels the weights it started with


def _without_request_id(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """``headers`` less ``X-Request-Id``, which vLLM would take as the request id (abort by
    rid would then miss)."""
    if not headers:
        return None
    return {k: v for k, v in headers.items() if k.lower() != "x-request-id"} or None


class VllmEngineClient:
    """Client of one vLLM server; build it with :func:`relaxtrio.vllm.connections.open_vllm_client`
    or :meth:`relaxtrio.vllm.connections.VllmConnections.client`.

    Args:
        url: the server's base URL (``http://host:port``).
        generation: the pool of generation traffic (a :class:`~relaxtrio.sglang._pool.
            ConnectionPool`, or an ``httpx.AsyncClient`` with a custom transport).
        control: the ``httpx.AsyncClient`` of control traffic.
        config: limits and timeouts (:class:`~relaxtrio.sglang.client.EngineClientConfig`).
        versions: the weight label last set or read per engine URL, shared by the clients of
            one pool (a fleet holds several clients per engine); it labels answers without
            tokens.
    """

    context_token_limit = staticmethod(context_token_limit)

    def __init__(self, url: str, *, generation: httpx.AsyncClient | ConnectionPool,
                 control: httpx.AsyncClient, config: EngineClientConfig,
                 versions: MutableMapping[str, str] | None = None):
        self.url = url.rstrip("/")
        self.config = config
        self._generation = generation
        self._control = control
        self._ids_json = IdsJsonEncoder()
        self._generate_timeout = httpx.Timeout(None, connect=config.connect_timeout_s)
        self._versions: MutableMapping[str, str] = {} if versions is None else versions

    @property
    def _weight_version(self) -> str:
        return self._versions.get(self.url, _INITIAL_VERSION)

    @_weight_version.setter
    def _weight_version(self, label: str) -> None:
        self._versions[self.url] = label

    @property
    def urls(self) -> tuple[str, ...]:
        """``(url,)``: the engines this client talks to."""
        return (self.url,)

    # ------------------------------------------------------------------ transport
    async def _call(self, path: str, body: dict[str, Any] | None = None, *, method: str = "POST",
                    slow: bool = False, attempts: int | None = None) -> httpx.Response:
        """A control call to ``path`` (with its query string); raises on an HTTP error status.

        ``slow`` uses ``weight_update_timeout_s`` (pause may wait for requests, reloads take
        seconds) instead of ``control_timeout_s``; ``attempts`` overrides the config's tries.

        Raises:
            EngineRejectedError: a 4xx answer. EngineUnavailableError: a 5xx answer after
                retries, or the engine could not be reached.
        """
        timeout = httpx.Timeout(
            self.config.weight_update_timeout_s if slow else self.config.control_timeout_s,
            connect=self.config.connect_timeout_s,
        )
        config = self.config if attempts is None else attrs.evolve(self.config, max_attempts=attempts)
        response = await send_with_retries(self._control, method, self.url, path, body,
                                           httpx_timeout=timeout, config=config)
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.content,
                                      engine_url=self.url, path=path)
        return response

    def _body(self, input_ids: Sequence[int], fields: dict[str, Any], prefix_key: str | None) -> bytes:
        """``{"token_ids": [...], **fields}`` as UTF-8 JSON, reusing the id text of a recent
        prompt of the same family (:mod:`relaxtrio.sglang._ids_json`)."""
        ids = self._ids_json.ids_text(input_ids, prefix_key).encode("ascii")
        rest = orjson.dumps(fields)
        return b"".join((b'{"token_ids":[', ids, b"],", rest[1:]))

    # ------------------------------------------------------------------ generation
    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        rid: str,
        return_logprob: bool = True,
        session_id: str | None = None,
        routing_key: str | None = None,
        image_data: Sequence[str] | None = None,
        headers: dict[str, str] | None = None,
        prefix_key: str | None = None,
    ) -> GenerateResult:
        """Generate from token ids (``POST /inference/v1/generate``).

        Args:
            input_ids: prompt ids, length >= 1.
            sampling: SGLang-native sampling parameters (translated by
                :func:`~relaxtrio.vllm.wire.vllm_sampling_params`); ``max_new_tokens = 0``
                answers at once with no output (vLLM refuses a budget of 0).
            rid: request id, the abort key; unique among this engine's requests in flight.
            return_logprob: request per-token logprobs (required for training).
            session_id: unused (vLLM has no sessions); accepted for the common interface.
            routing_key: unused (one engine per client); accepted for the common interface.
            image_data: must be empty: this client sends no images yet.
            headers: extra HTTP headers (``X-Request-Id`` is dropped), or None.
            prefix_key: the family of prompts this one belongs to (the Session id), for the
                body's JSON reuse; None compares with all recent prompts.

        Returns:
            The normalized result; ``len(output_logprobs) == len(output_ids)`` when
            ``return_logprob``. An aborted request returns normally with ``finish_type ==
            "abort"`` and its partial output.

        Raises:
            InvalidRequestError: images, or a sampling field vLLM has no equivalent for
                (``param`` names it).
            ContextLengthExceededError: the prompt does not fit the context (a budget that does
                not fit is clamped by vLLM instead).
            EngineRejectedError: any other 4xx answer.
            BackendTimeoutError: connecting timed out on every attempt.
            EngineUnavailableError: a 5xx answer after retries, a transport failure, or an
                answer that breaks the protocol.

        Cancellation:
            A checkpoint. Cancelling drops the HTTP request; vLLM notices the disconnect and
            aborts the request, but its partial output is lost. To keep partial output, call
            :meth:`abort` and let this call return.
        """
        if image_data:
            raise InvalidRequestError("image_data is not supported by the vLLM engine client",
                                      param="image_data")
        if sampling.max_new_tokens == 0:
            return GenerateResult(
                output_ids=(), output_logprobs=(), finish_type="length", finish_matched=0,
                prompt_tokens=len(input_ids), completion_tokens=0, cached_tokens=None,
                weight_version=self._weight_version, weight_versions=(), text="", meta_info={})
        fields = {"request_id": rid,
                  "sampling_params": vllm_sampling_params(sampling, return_logprob=return_logprob)}
        body = self._body(input_ids, fields, prefix_key)
        response = await send_with_retries(
            self._generation, "POST", self.url, _GENERATE_PATH, body,
            httpx_timeout=self._generate_timeout, config=self.config,
            headers=_without_request_id(headers),
        )
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.content,
                                      engine_url=self.url, path=_GENERATE_PATH)
        try:
            payload = response.json()
        except ValueError as exc:
            raise EngineUnavailableError(f"engine {self.url}{_GENERATE_PATH} sent invalid JSON",
                                         engine_url=self.url) from exc
        return parse_generate_response(payload, return_logprob=return_logprob,
                                       weight_version=self._weight_version)

    # ------------------------------------------------------------------ control
    async def abort(self, rid: str) -> None:
        """Abort request ``rid``; its :meth:`generate` call returns the partial output.

        A rid the engine does not hold (finished, or not arrived yet) is a no-op there.

        Raises:
            BackendError: the engine failed or could not be reached (after retries).

        Cancellation:
            A checkpoint; an abort already received stands.
        """
        await self._call("/abort_requests", {"request_ids": [server_request_id(rid)]})

    async def abort_all(self) -> None:
        """Abort every request on the engine (each returns its partial output).

        Raises:
            BackendError: the engine failed or could not be reached (after retries).

        Cancellation:
            A checkpoint; an abort already received stands.
        """
        await self._call("/abort_requests", {})

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Pause the engine; new generations queue there until :meth:`continue_generation`.

        Args:
            mode: ``abort`` ends running requests with partial output; ``keep`` freezes them
                (they continue on resume; SGLang's ``retract`` and ``in_place`` mean this
                too); ``wait`` returns once they have finished.

        Raises:
            ValueError: an unknown mode.
            BackendError: the engine failed or could not be reached.

        Cancellation:
            A checkpoint; an engine already reached stays paused: call
            :meth:`continue_generation` (shielded) to undo.
        """
        if mode not in _VLLM_PAUSE_MODE:
            raise ValueError(f"unknown pause mode {mode!r}; expected one of {sorted(_VLLM_PAUSE_MODE)}")
        await self._call(f"/pause?mode={_VLLM_PAUSE_MODE[mode]}", slow=True)

    async def continue_generation(self) -> None:
        """Resume after :meth:`pause_generation` (a no-op when not paused).

        Raises:
            BackendError: the engine failed or could not be reached.

        Cancellation:
            A checkpoint.
        """
        await self._call("/resume")

    async def is_paused(self) -> bool:
        """Whether the engine is paused (``GET /is_paused``).

        Raises:
            BackendError: HTTP error, a malformed answer, or an unreachable engine.

        Cancellation:
            A checkpoint.
        """
        payload = json_object(await self._call("/is_paused", method="GET"), self.url)
        paused = payload.get("is_paused")
        if not isinstance(paused, bool):
            raise EngineUnavailableError(f"engine {self.url}/is_paused sent {payload!r}",
                                         engine_url=self.url)
        return paused

    async def update_weights_from_disk(
        self,
        model_path: str,
        *,
        weight_version: str | None,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
    ) -> None:
        """Load a checkpoint directory into the running model, then relabel the weights.

        For a clean cut, pause with ``keep`` first and resume after: with ``flush_cache`` the
        kept requests recompute their prefix on the new weights, and their tokens from then
        on carry the new version. Without a pause, requests running during the reload mix
        both weights inside one step.

        Args:
            model_path: a Hugging Face checkpoint directory readable by the engine (a
                :class:`~relaxtrio.train.weight_store.DiskWeightStore` version directory).
            weight_version: new version label (None keeps the old label).
            abort_all_requests: abort every request first (they return partial output).
            flush_cache: drop the prefix cache and the running requests' keys and values
                (``/reset_prefix_cache?reset_running_requests=true``); without it, cached
                prefixes keep the old weights' keys and values.

        Raises:
            EngineUnavailableError: the reload failed (the engine's weights are now undefined:
                restart it), or the engine failed or could not be reached.
            EngineRejectedError: the engine refused a call with a 4xx, or could not drop its
                prefix cache.

        Cancellation:
            A checkpoint; a reload already sent runs to its end on the engine.
        """
        if abort_all_requests:
            await self.abort_all()
        body = {"method": "reload_weights", "kwargs": {"weights_path": model_path}}
        try:
            await self._call("/collective_rpc", body, slow=True, attempts=1)
        except EngineUnavailableError as exc:
            raise EngineUnavailableError(
                f"engine {self.url} failed to load the weights in {model_path} and must be "
                f"restarted: {exc}", engine_url=self.url, status_code=exc.status_code) from exc
        if flush_cache:
            await self._reset_prefix_cache(reset_running_requests=True)
        if weight_version is not None:
            await self.update_weight_version(weight_version)

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False) -> None:
        """Relabel the weights; later tokens carry ``new_version`` in their spans.

        Args:
            new_version: the label.
            abort_all_requests: abort every request first.

        Raises:
            BackendError: the engine failed or could not be reached.

        Cancellation:
            A checkpoint; a relabel already received stands.
        """
        if abort_all_requests:
            await self.abort_all()
        await self._call("/update_weight_version", {"new_version": new_version})
        self._weight_version = new_version

    async def close_session(self, session_id: str) -> None:
        """A no-op (not a checkpoint): vLLM keeps no per-session state."""

    async def flush_cache(self) -> None:
        """Drop the prefix cache (``POST /reset_prefix_cache``); running requests keep theirs.

        Raises:
            EngineRejectedError: the engine refused (blocks still held by running requests).
            EngineUnavailableError: the engine failed or could not be reached.

        Cancellation:
            A checkpoint.
        """
        await self._reset_prefix_cache(reset_running_requests=False)

    async def _reset_prefix_cache(self, *, reset_running_requests: bool) -> None:
        query = "?reset_running_requests=true" if reset_running_requests else ""
        response = await self._call(f"/reset_prefix_cache{query}", slow=True)
        if json_object(response, self.url).get("success") is not True:
            raise EngineRejectedError(
                f"engine {self.url} could not reset its prefix cache (requests still hold blocks)",
                engine_url=self.url, status_code=response.status_code)

    # ------------------------------------------------------------------ health / info
    async def health_status(self) -> int:
        """``GET /health`` (with the config's retries): the HTTP status of the last answer
        (200 also while paused).

        Raises:
            EngineUnavailableError: the engine could not be reached (``__cause__``: the
                ``httpx.TransportError``); BackendTimeoutError when no attempt was answered.

        Cancellation:
            A checkpoint.
        """
        timeout = httpx.Timeout(self.config.control_timeout_s, connect=self.config.connect_timeout_s)
        response = await send_with_retries(self._control, "GET", self.url, "/health", None,
                                           httpx_timeout=timeout, config=self.config)
        return response.status_code

    async def weight_version(self) -> str | None:
        """The label of the weights the engine serves now (``GET /weight_info``).

        Raises:
            BackendError: HTTP error, a malformed answer, or an unreachable engine.

        Cancellation:
            A checkpoint.
        """
        version = json_object(await self._call("/weight_info", method="GET"), self.url).get("weight_version")
        if not isinstance(version, str):
            return None
        self._weight_version = version
        return version

    async def health(self) -> bool:
        """Whether :meth:`health_status` is 200 (also while paused); never raises. A checkpoint."""
        try:
            return await self.health_status() == 200
        except RelaxError:
            return False

    async def model_info(self) -> dict[str, Any]:
        """What the engine serves, in the keys relaxtrio reads from SGLang's ``/model_info``.

        Returns:
            ``{"model_path": str, "served_model_name": str, "max_model_len": int | None,
            "weight_version": str}`` from ``/v1/models`` and ``/weight_info``. vLLM reports no
            ``model_type`` / ``architectures``, so
            :func:`relaxtrio.models.served_model_mismatch` compares nothing.

        Raises:
            BackendError: HTTP error, a malformed answer, or an unreachable engine.

        Cancellation:
            A checkpoint.
        """
        models = json_object(await self._call("/v1/models", method="GET"), self.url)
        version = json_object(await self._call("/weight_info", method="GET"), self.url)
        info = model_info_from(models, version, engine_url=self.url)
        if isinstance(info["weight_version"], str):
            self._weight_version = info["weight_version"]
        return info

    async def server_info(self) -> dict[str, Any]:
        """The engine's settings that relaxtrio reads, plus its whole config.

        Returns:
            ``{"engine": "vllm", "version": str, "context_length": int (max_model_len),
            "logprobs_mode": str, "enable_prefix_caching": bool, "max_num_seqs": int,
            "model_path": str, "vllm_config": dict}`` (``/server_info?config_format=json`` and
            ``/version``); see :mod:`relaxtrio.vllm.info`.

        Raises:
            BackendError: HTTP error, a malformed answer, or an unreachable engine.

        Cancellation:
            A checkpoint.
        """
        raw = json_object(await self._call("/server_info?config_format=json", method="GET"), self.url)
        version = json_object(await self._call("/version", method="GET"), self.url)
        return server_info_from(raw, version, engine_url=self.url)
