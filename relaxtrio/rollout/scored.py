"""A scored context: what one rollout step hands the trainer per exported context.

Kept apart from :mod:`relaxtrio.rollout.step` so that it imports only attrs and the forest: the
sharded trainer's rank processes unpickle these records, and they must not load trio or the
rollout machinery to do so.
"""

from __future__ import annotations

import attrs

from ..forest import TrainingSample

__all__ = ["ScoredSample"]


@attrs.frozen(kw_only=True)
class ScoredSample:
    """One exported context with its scalar reward and its base credit.

    The trainer reads ``sample`` and ``advantage``
    (:class:`relaxtrio.train.batching.ScoredLike`); ``reward`` travels with them for metrics and
    dumps. The trainer checks that ``advantage`` is finite (it is the boundary every caller
    passes), so an invalid value is refused there with the sample's index.

    Attributes:
        sample: the context (a :class:`~relaxtrio.forest.TrainingSample`; the trainer accepts
            anything with its three token fields).
        reward: the primary scalar reward the credit came from; None for a context without a
            reward under custom advantage.
        advantage: the base credit, broadcast over the context's ``loss_mask == 1`` tokens:
            the estimator's (e.g. GRPO: the reward normalized within the Group), the custom
            advantage function's, or 0.0 for an eval context.
    """

    sample: TrainingSample
    reward: float | None
    advantage: float

