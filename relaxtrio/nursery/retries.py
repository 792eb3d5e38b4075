"""Idempotent retries: a repeated request gets the answer its client never received.

An SDK that times out closes its connection and sends the same request again. The first turn
was not cancelled by the disconnect (turns run in the Session's nursery), so without help the
Session would end with two sampled answers to one state, and implicit export would fail with
two leaves. The rule (docs/agent-contract.md#retries):

* A generation is keyed by :class:`RetryKey`: the state hash of the node it continues (after
  the request's new observation is committed) and the digest of its sampling inputs
  (:meth:`~relaxtrio.nursery.turns.TurnRequest.sampling_digest`).
* It is *orphaned* while no request attached to it still waits for it (every client went away)
  and its answer was never handed to a waiting request.
* A request whose key names an orphaned generation attaches to it instead of sampling: it waits
  for it if it is still generating, or gets the committed answer at once.
* Everything else samples anew, so a different seed, a second request while the first client
  still waits (concurrent siblings), or a repeat after the answer was delivered still branches.

The ledger lives with the Session (the nursery layer), not in the forest: the forest stays a pure
record of committed states, and whether a client received an answer is a fact about connections.
A delivered or failed generation leaves the ledger; an orphaned committed one stays until a
retry takes it or the Session ends. At export, :meth:`RetryLedger.undelivered_states` names the
committed answers that never reached the agent, which implicit export treats as side leaves
(:func:`~relaxtrio.forest.select_leaves`): an agent that gave up on a turn and asked again with a
changed request (another token limit) still has one linear history.
"""

from __future__ import annotations

import attrs
import trio

from .._errors import RelaxError
from .turns import TurnResult


@attrs.frozen
class RetryKey:
    """What makes two requests the same generation.

    Attributes:
        parent_hash: state hash of the node the generation continues.
        sampling_digest: digest of the request's sampling inputs.
    """

    parent_hash: str
    sampling_digest: str


@attrs.frozen(kw_only=True)
class RetryStatistics:
    """A snapshot of one Session's :class:`RetryLedger`.

    Attributes:
        num_generating: generations still sampling.
        num_orphaned: generations no client waits for and none received (still sampling or
            committed).
        num_undelivered: committed answers no client received.
        num_attached: requests answered from an earlier generation instead of a new sample.
    """

    num_generating: int
    num_orphaned: int
    num_undelivered: int
    num_attached: int


@attrs.define(eq=False, kw_only=True)
class Generation:
    """One sampled turn and the requests waiting for it.

    Attributes:
        key: the turn's retry key.
        done: set once the turn committed (``result``) or failed (``error``).
        result: the committed answer.
        error: why the turn failed.
        num_waiting: attached requests whose clients still wait.
        delivered: the answer was handed to a waiting request.
    """

    key: RetryKey
    done: trio.Event = attrs.field(factory=trio.Event)
    result: TurnResult | None = None
    error: RelaxError | None = None
    num_waiting: int = 0
    delivered: bool = False

    @property
    def orphaned(self) -> bool:
        """No client waits for it and none got its answer (a retry may take it)."""
        return self.num_waiting == 0 and not self.delivered and self.error is None

    async def wait_result(self) -> TurnResult:
        """Waits until the turn ends and returns its answer.

        Raises:
            RelaxError: the error the turn failed with.

        Cancellation:
            A plain wait; the turn itself is not affected.
        """
        await self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


@attrs.define(eq=False, kw_only=True)
class RetryLedger:
    """The generations of one Session that a retry could still attach to.

    Every method is synchronous (no checkpoint), so a lookup and the registration that follows
    it cannot interleave with another turn.
    """

    _by_key: dict[RetryKey, list[Generation]] = attrs.field(factory=dict)
    _num_attached: int = 0
    _delivered_states: set[str] = attrs.field(factory=set)  # response hashes some client received

    def statistics(self) -> RetryStatistics:
        """A snapshot of the ledger."""
        gens = [g for gens in self._by_key.values() for g in gens]
        return RetryStatistics(
            num_generating=sum(not g.done.is_set() for g in gens),
            num_orphaned=sum(g.orphaned for g in gens),
            num_undelivered=sum(g.done.is_set() and g.orphaned for g in gens),
            num_attached=self._num_attached,
        )

    def undelivered_states(self) -> frozenset[str]:
        """State hashes of committed answers no client received (orphaned, never taken by a
        retry), leaving out a state another generation delivered (an identical answer)."""
        return frozenset(g.result.state_hash for gens in self._by_key.values() for g in gens
                         if g.result is not None and g.orphaned) - self._delivered_states

    def orphan(self, key: RetryKey) -> Generation | None:
        """The oldest orphaned generation of ``key``, or None."""
        return next((g for g in self._by_key.get(key, ()) if g.orphaned), None)

    def open(self, key: RetryKey) -> Generation:
        """Registers a new generation of ``key`` (still sampling)."""
        generation = Generation(key=key)
        self._by_key.setdefault(key, []).append(generation)
        return generation

    def note_attached(self) -> None:
        """Counts a request answered from an earlier generation."""
        self._num_attached += 1

    def finish(self, generation: Generation, *, result: TurnResult | None = None,
               error: RelaxError | None = None) -> None:
        """Records the turn's outcome and wakes attached requests; a failed turn leaves."""
        generation.result, generation.error = result, error
        generation.done.set()
        if error is not None or result is None:
            self._drop(generation)

    def deliver(self, generation: Generation) -> None:
        """The answer was handed to a waiting request: no retry may take it any more."""
        generation.delivered = True
        if generation.result is not None:
            self._delivered_states.add(generation.result.state_hash)
        if generation.done.is_set():
            self._drop(generation)

    def _drop(self, generation: Generation) -> None:
        gens = self._by_key.get(generation.key, [])
        if generation in gens:
            gens.remove(generation)
            if not gens:
                del self._by_key[generation.key]
