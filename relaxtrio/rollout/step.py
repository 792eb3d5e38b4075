"""One rollout step: dataset prompts → Groups of Sessions → scored training samples.

Groups run concurrently, at most ``agentic_concurrency`` resident at once. A dropped Group (any
Session failed) is logged with its reason, counted, and replaced by a new prompt while the
refill budget lasts, so a step still trains on ``rollout_batch_size`` Groups when agents fail
now and then. Results keep dataset order within the step (Groups by launch order, Sessions by
sample index).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio
from tqdm import tqdm

from .._errors import ExportError, InvalidRequestError
from ..forest import SessionForest, TrainingSample
from ..nursery.agent import ActiveBudget, AgentConfig, RolloutMode
from ..nursery.group import Group, run_group
from ..nursery.session import Session, SessionRegistry, new_session_id
from .advantages import grpo_advantages, scalar_reward
from .dataset import Prompt, PromptStream
from .turns import EngineTurnHandler

log = logging.getLogger(__name__)


def agentic_event(component: str, event: str, **fields: Any) -> str:
    """The ``AGENTIC <COMPONENT> event=<name> k=v ...`` log line (None fields omitted)."""
    parts = [f"AGENTIC {component.upper()} event={event}"]
    parts += [f"{k}={v}" for k, v in fields.items() if v is not None]
    return " ".join(parts)


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """Shape of a rollout step.

    Attributes:
        n_samples_per_prompt: Sessions per Group.
        rollout_batch_size: Groups trained on per step.
        agentic_concurrency: resident Groups at once (default: rollout_batch_size).
        max_refills: how many dropped Groups a step may replace (default: rollout_batch_size).
        reward_key: primary key of object rewards.
        custom_rm: ``fn(sample) -> float`` for samples the agent did not reward, or None.
        show_progress: whether to draw the tqdm progress bar.
    """

    n_samples_per_prompt: int = 4
    rollout_batch_size: int = 4
    agentic_concurrency: int | None = None
    max_refills: int | None = None
    reward_key: str | None = None
    custom_rm: Callable[[TrainingSample], float] | None = None
    show_progress: bool = True


@attrs.frozen(kw_only=True)
class ScoredGroup:
    """A completed Group with one scalar reward and one GRPO advantage per sample.

    Attributes:
        group: the finished Group.
        samples: its samples, Session order (one per Session with implicit export).
        rewards: scalar reward per sample.
        advantages: GRPO advantage per sample (reward normalized within the Group).
    """

    group: Group
    samples: tuple[TrainingSample, ...]
    rewards: tuple[float, ...]
    advantages: tuple[float, ...]


@attrs.frozen(kw_only=True)
class StepResult:
    """What one rollout step produced."""

    rollout_id: int
    groups: tuple[ScoredGroup, ...]
    dropped: tuple[Group, ...]
    rollout_s: float

    @property
    def samples(self) -> list[TrainingSample]:
        """All samples, Group by Group."""
        return [s for g in self.groups for s in g.samples]

    @property
    def advantages(self) -> list[float]:
        """All advantages, aligned with :attr:`samples`."""
        return [a for g in self.groups for a in g.advantages]

    @property
    def rewards(self) -> list[float]:
        """All scalar rewards, aligned with :attr:`samples`."""
        return [r for g in self.groups for r in g.rewards]


@attrs.define(eq=False, kw_only=True)
class RolloutRunner:
    """Runs rollout steps against one API server, engine and agent configuration."""

    config: RolloutConfig
    agent: AgentConfig
    registry: SessionRegistry
    handler: EngineTurnHandler
    base_url: str
    prompts: PromptStream
    max_context_tokens: int | None = None
    server_template_kwargs: dict[str, Any] = attrs.field(factory=dict)
    _group_seq: int = 0
    _capacity: trio.CapacityLimiter = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        limit = self.config.agentic_concurrency or self.config.rollout_batch_size
        self._capacity = trio.CapacityLimiter(limit)

    def make_group(self, prompt: Prompt, mode: RolloutMode = "train") -> Group:
        """Builds the Group (n Sessions) for one prompt."""
        self._group_seq += 1
        group = Group(group_id=f"{mode}:group_{self._group_seq:06d}", mode=mode,
                      prompt_index=prompt.index)
        for i in range(self.config.n_samples_per_prompt):
            session_id = new_session_id()
            group.sessions.append(
                Session(
                    session_id=session_id,
                    group=group,
                    index=i,
                    input_payload=prompt.session_input(),
                    dataset_metadata=dict(prompt.metadata),
                    forest=SessionForest(session_id, max_context_tokens=self.max_context_tokens),
                    budget=ActiveBudget(total_s=self.agent.timeout_s),
                )
            )
        return group

    def score(self, group: Group) -> ScoredGroup:
        """Scalar rewards and GRPO advantages for a completed Group.

        Raises:
            ExportError: a Session exported several contexts (needs custom advantage) or a
                sample has no reward and no custom RM is configured.
        """
        samples: list[TrainingSample] = []
        rewards: list[float] = []
        for session in group.sessions:
            if len(session.samples) != 1:
                raise ExportError(
                    f"session {session.index} exported {len(session.samples)} contexts; "
                    "more than one context per session requires --agentic-custom-advantage-path",
                    session_id=session.session_id,
                )
            sample = session.samples[0]
            if sample.reward is None:
                if self.config.custom_rm is None:
                    raise ExportError(
                        f"session {session.index} wrote no reward; write reward in "
                        "RELAX_OUTPUT_JSON or configure --custom-rm-path",
                        session_id=session.session_id,
                    )
                value = float(self.config.custom_rm(sample))
            else:
                try:
                    value = scalar_reward(sample.reward, self.config.reward_key)
                except (ValueError, InvalidRequestError) as exc:
                    raise ExportError(f"session {session.index}: {exc}",
                                      session_id=session.session_id) from exc
            if not math.isfinite(value):
                raise ExportError(f"session {session.index}: reward is not finite",
                                  session_id=session.session_id)
            samples.append(sample)
            rewards.append(value)
        return ScoredGroup(group=group, samples=tuple(samples), rewards=tuple(rewards),
                           advantages=tuple(grpo_advantages(rewards)))

    async def run_step(self, rollout_id: int) -> StepResult:
        """Runs Groups until ``rollout_batch_size`` of them completed (or refills ran out).

        Cancellation:
            Cancelling terminates every agent of every resident Group before returning.
        """
        cfg = self.config
        started = time.monotonic()
        self.handler.rollout_id = rollout_id
        target = cfg.rollout_batch_size
        refills_left = cfg.max_refills if cfg.max_refills is not None else target
        log.info(agentic_event("rollout", "accounting_start", rollout=rollout_id,
                               sessions=target * cfg.n_samples_per_prompt, groups=target))
        scored: list[tuple[int, ScoredGroup]] = []
        dropped: list[Group] = []
        bar = tqdm(total=target * cfg.n_samples_per_prompt, desc=f"Rollout {rollout_id} generation",
                   unit="session", disable=not cfg.show_progress, leave=False)
        send, recv = trio.open_memory_channel[tuple[int, Group]](0)

        async def run_one(order: int, group: Group) -> None:
            async with self._capacity:
                await run_group(group, agent=self.agent, base_url=self.base_url,
                                registry=self.registry,
                                server_template_kwargs=self.server_template_kwargs)
            await send.send((order, group))

        try:
            async with trio.open_nursery() as nursery:
                launched = 0
                for _ in range(target):
                    nursery.start_soon(run_one, launched, self.make_group(next(self.prompts)))
                    launched += 1
                running = target
                while running:
                    order, group = await recv.receive()
                    running -= 1
                    if not group.dropped:
                        try:
                            scored.append((order, self.score(group)))
                            bar.update(len(group.sessions))
                            bar.set_postfix(scored=len(scored) * cfg.n_samples_per_prompt)
                            continue
                        except ExportError as exc:
                            group.dropped_reason = str(exc)
                            log.warning("Dropped group %s: %s", group.group_id, exc)
                    dropped.append(group)
                    if refills_left > 0:
                        refills_left -= 1
                        nursery.start_soon(run_one, launched, self.make_group(next(self.prompts)))
                        launched += 1
                        running += 1
        finally:
            bar.close()
        scored.sort(key=lambda item: item[0])
        result = StepResult(rollout_id=rollout_id, groups=tuple(g for _, g in scored),
                            dropped=tuple(dropped), rollout_s=time.monotonic() - started)
        log.info(agentic_event("rollout", "accounting_end", rollout=rollout_id,
                               groups=len(result.groups), rows=len(result.samples),
                               debt=max(target - len(result.groups), 0),
                               dropped_groups=len(dropped)))
        return result


def group_metrics(result: StepResult) -> Mapping[str, float]:
    """Reward and length statistics of a step (means over samples)."""
    rewards = result.rewards
    n = len(rewards)
    mean = sum(rewards) / n if n else float("nan")
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n) if n else float("nan")
    lengths = [sum(s.loss_mask) for s in result.samples]
    turns = [s.metadata.get("rollout_turns", 0) for s in result.samples]
    return {
        "reward_mean": mean,
        "reward_std": std,
        "response_length_mean": sum(lengths) / n if n else float("nan"),
        "sequence_length_mean": sum(len(s.token_ids) for s in result.samples) / n if n else float("nan"),
        "turns_mean": sum(turns) / n if n else float("nan"),
        "num_groups": float(len(result.groups)),
        "num_samples": float(n),
        "dropped_groups": float(len(result.dropped)),
        "rollout_s": result.rollout_s,
    }
