"""What the fleet needs of one engine: the per-engine client interface.

An engine wire protocol is one module that implements :class:`EngineAPI` (a client of exactly
one engine) and :class:`EngineConnections` (the connection pools its clients share, opened by an
:data:`OpenConnections` function). The fleet, and everything above it, calls only these methods,
so a second protocol is a sibling module, never a branch in a caller:

- SGLang's native API (and relaxtrio's embedded CPU engine, which speaks it):
  :class:`relaxtrio.sglang.client.EngineClient`, :class:`relaxtrio.sglang.client.SGLangConnections`,
  :func:`relaxtrio.sglang.client.open_connections` (the default of
  :func:`relaxtrio.fleet.fleet.open_engine_fleet`);
- vLLM's (``/inference/v1/generate``, ``/abort_requests``, ``/pause``, ``/resume``,
  ``/collective_rpc`` ``reload_weights``): :class:`relaxtrio.vllm.client.VllmEngineClient`,
  :class:`relaxtrio.vllm.connections.VllmConnections`,
  :func:`relaxtrio.vllm.connections.open_connections`.

:func:`relaxtrio.fleet.connect.open_fleet` picks one by the run's backend.

The value types are shared by every protocol: requests carry
:class:`~relaxtrio.sglang.wire.SamplingParams` (SGLang's native sampling parameters, the
canonical form: another protocol translates them) and answers are
:class:`~relaxtrio.sglang._replies.GenerateResult`; both are re-exported here.

Errors (every method, every protocol; :mod:`relaxtrio._errors`):

- :class:`~relaxtrio.ContextLengthExceededError`: the engine refused the prompt / budget as too
  long (``generate`` only);
- :class:`~relaxtrio.EngineRejectedError` (a :class:`~relaxtrio.BackendError`): a 4xx answer, a
  problem of this request; the fleet hands it back to the caller and keeps the worker;
- :class:`~relaxtrio.EngineUnavailableError`: a 5xx answer after retries, a malformed answer, or
  a transport failure, with ``engine_url`` (and ``status_code`` for an HTTP answer); a transport
  failure has the ``httpx.TransportError`` as ``__cause__`` (``httpx.ConnectError`` when the
  connection was refused), which is how the fleet tells a dead worker (removed at once) from one
  that answered badly; :class:`~relaxtrio.BackendTimeoutError` (a subclass) when no attempt was
  answered in time.

Retries are the client's (its :class:`EngineClientConfig`: ``max_attempts``, timeouts); the fleet
makes clients with ``max_attempts=1`` where it fails over instead (generation, health probes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from ..sglang._http import EngineClientConfig
from ..sglang._replies import GenerateResult
from ..sglang.client import PauseMode
from ..sglang.wire import SamplingParams

__all__ = ["EngineAPI", "EngineClientConfig", "EngineConnections", "GenerateResult",
           "OpenConnections", "PauseMode", "SamplingParams"]


class EngineAPI(Protocol):
    """A client of exactly one engine. Every method is a trio checkpoint; cancelling one drops
    its HTTP request (what already reached the engine stays done). Errors as in the module
    docstring.

    Attributes:
        url: the engine's base URL, ``http://host:port`` without a trailing slash.
    """

    url: str

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        rid: str,
        return_logprob: bool = True,
        session_id: str | None = None,
        image_data: Sequence[str] | None = None,
        headers: dict[str, str] | None = None,
        prefix_key: str | None = None,
    ) -> GenerateResult:
        """Generate a continuation of ``input_ids``.

        Args:
            input_ids: prompt token ids, length >= 1; with images, one placeholder id per image.
            sampling: sampling parameters (``max_new_tokens`` in tokens; stop ids/strings).
            rid: request id, the key of :meth:`abort`; unique, and no rid a prefix of another.
            return_logprob: return one logprob per output id (training needs them).
            session_id: the engine's session key (SGLang ``session_id``), or None; a protocol
                without engine sessions ignores it.
            image_data: the prompt's images in placeholder order (``data:`` URLs), or None.
            headers: extra HTTP headers (the gateway's routing key), or None.
            prefix_key: the family of prompts this one extends (the Session id), a hint for
                reusing the encoding of an earlier request body; None is always correct.

        Returns:
            The normalized result: ``len(output_logprobs) == len(output_ids)`` when
            ``return_logprob``; an aborted request returns normally with ``finish_type ==
            "abort"`` and its partial output (ids and logprobs so far).
        """
        ...

    async def abort(self, rid: str) -> None:
        """Ask the engine to stop ``rid``; done when its :meth:`generate` returns (aborted).
        A rid the engine does not hold is a no-op."""
        ...

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Stop generating until :meth:`continue_generation`; new requests wait there.

        Args:
            mode: what happens to running requests: ``abort`` ends them (aborted, partial
                output returned), ``retract`` keeps them and continues them after resume (on
                the weights loaded meanwhile), ``in_place`` freezes them where they are.
        """
        ...

    async def continue_generation(self) -> None:
        """Resume after :meth:`pause_generation` (a no-op when not paused)."""
        ...

    async def update_weights_from_disk(
        self,
        model_path: str,
        *,
        weight_version: str | None,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
    ) -> None:
        """Load the weights at ``model_path`` (a checkpoint directory the engine can read, or a
        shared-memory manifest for a local embedded engine) and label them ``weight_version``
        (None keeps the label). Raises :class:`~relaxtrio.EngineRejectedError` when the engine
        reports that loading failed. May take minutes (``weight_update_timeout_s``)."""
        ...

    async def weight_version(self) -> str | None:
        """The label of the weights the engine serves now, or None when it reports none (the
        fleet compares it with the version it loaded)."""
        ...

    async def close_session(self, session_id: str) -> None:
        """Release a session's engine-side state (a no-op where unknown or unsupported)."""
        ...

    async def flush_cache(self) -> None:
        """Drop the engine's prefix cache (refused while requests run)."""
        ...

    async def health_status(self) -> int:
        """One ``GET /health`` (retried per the client's config): the HTTP status (200:
        healthy). A transport failure raises (see the module docstring). Not while paused:
        an SGLang probe generation waits behind the pause."""
        ...

    async def health(self) -> bool:
        """Whether :meth:`health_status` is 200; never raises."""
        ...

    async def model_info(self) -> dict[str, Any]:
        """The engine's model description as a JSON object; the keys callers read are
        ``weight_version`` and the served config's ``model_type`` and ``architectures``
        (:func:`relaxtrio.models.served_model_mismatch`); missing keys are allowed."""
        ...

    async def server_info(self) -> dict[str, Any]:
        """The engine's server description as a JSON object; the keys callers read are
        ``context_length`` / ``max_req_input_len`` (tokens,
        :func:`relaxtrio.sglang.client.context_token_limit`) and ``frontend`` (``"relaxtrio"``
        for an embedded engine); missing keys are allowed."""
        ...


class EngineConnections(Protocol):
    """The connection pools of one protocol's clients: every client made here shares them."""

    def client(self, url: str, config: EngineClientConfig | None = None) -> EngineAPI:
        """A client of the engine at ``url`` (no I/O); ``config``: its timeouts and retries
        (default: the pools' own config)."""
        ...


OpenConnections = Callable[[EngineClientConfig], AbstractAsyncContextManager[EngineConnections]]
"""Opens a protocol's pools with these limits and timeouts, closing them on exit
(:func:`relaxtrio.sglang.client.open_connections`)."""
