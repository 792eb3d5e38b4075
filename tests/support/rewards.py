"""Reward models and dynamic filters loaded by dotted path in tests."""

from __future__ import annotations

import trio

CALLS: list[str] = []


def length_reward(sample):
    """Sync ordinary RM: a reward object with a primary ``score`` and a helper ``length``."""
    CALLS.append(sample.session_id)
    return {"score": 1.0, "length": float(sum(sample.loss_mask))}


async def async_length_reward(sample):
    """Async ordinary RM (checkpoints, like a remote scorer would)."""
    await trio.lowlevel.checkpoint()
    return {"score": 0.5, "length": float(sum(sample.loss_mask))}


def group_rank_reward(samples):
    """Group RM: rewards 0, 1, 2, ... in the order it receives the samples."""
    return [float(i) for i in range(len(samples))]


def keep_none(samples, rewards):
    return False


# Hooks with Relax's signatures (``args`` first), as a user porting from Relax writes them.

def relax_reward(args, sample):
    """Relax's ordinary RM shape: ``fn(args, sample)``; reads a flag from ``args``."""
    return {"score": 1.0, "key_seen": float(args.reward_key == "score")}


async def relax_group_reward(args, samples):
    """Relax's group RM shape, async: ``fn(args, samples)``."""
    await trio.lowlevel.checkpoint()
    return [float(i) for i in range(len(samples))]


def relax_filter(args, samples, **kwargs):
    """Relax's dynamic filter shape: ``fn(args, samples, **kwargs)``; keeps nothing."""
    return False


def three_arguments(a, b, c):
    """Fits no hook shape."""
    return 0.0
