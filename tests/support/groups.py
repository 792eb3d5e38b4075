"""Finished Groups built directly (no agents), for scoring, reward and filter tests."""

from __future__ import annotations

import json
from typing import Any

from relaxtrio.forest import (
    Conversation,
    SessionForest,
    TrainingSample,
    export_samples,
    parse_session_output,
)
from relaxtrio.nursery.group import Group
from relaxtrio.nursery.session import Session
from tests.support.sessions import add_session

_SEQ = iter(range(1, 10**9))


def _session(group: Group, index: int, forest: SessionForest | None = None) -> Session:
    session = add_session(group, session_id=f"{group.group_id}-s{index}", budget_s=1.0)
    if forest is not None:
        session.forest = forest
    return session


def sample(reward: Any = None, *, name: str | None = None, session_id: str = "s",
           export_metadata: dict | None = None) -> TrainingSample:
    """A three-token context (two trained tokens) with the given reward."""
    return TrainingSample(
        name=name, session_id=session_id, token_ids=(1, 2, 3), prompt_length=1, loss_mask=(0, 1, 1),
        rollout_logprobs=(0.0, -1.0, -1.0), reward=reward, status="completed", weight_versions=(),
        metadata={"id": 99, **(export_metadata or {})}, export_metadata=dict(export_metadata or {}))


def group_of(rewards_per_session: list[list[Any]], *, mode: str = "train",
             metadata: list[list[dict]] | None = None) -> Group:
    """One Session per entry; each Session exports one context per reward (named when several)."""
    group = Group(group_id=f"{mode}:group_{next(_SEQ):06d}", mode=mode)  # type: ignore[arg-type]
    for i, rewards in enumerate(rewards_per_session):
        session = _session(group, i)
        for k, reward in enumerate(rewards):
            name = None if len(rewards) == 1 else ("main" if k == 0 else f"searcher_{k - 1}")
            meta = metadata[i][k] if metadata else None
            session.samples.append(sample(reward, name=name, session_id=session.session_id,
                                          export_metadata=meta))
    return group


def exported_group(records_per_session: list[list[dict]], *, mode: str = "train") -> Group:
    """A Group whose Sessions exported real samples (forest + explicit records)."""
    group = Group(group_id=f"{mode}:group_{next(_SEQ):06d}", mode=mode)  # type: ignore[arg-type]
    for i, records in enumerate(records_per_session):
        forest = SessionForest(f"{group.group_id}-s{i}")
        lines = []
        for r, record in enumerate(records):
            history = [{"role": "user", "content": f"task {r}"}]
            obs = forest.add_observation(forest.match(Conversation.from_wire(history)), token_ids=[1, 2])
            reply = {"role": "assistant", "content": f"answer {r}"}
            forest.add_response(obs, reply, token_ids=[3, 4], rollout_logprobs=[-0.5, -0.5],
                                finish_reason="stop", request_id=f"q{r}", rollout_id=0)
            lines.append(json.dumps({**record, "messages": [*history, reply]}))
        session = _session(group, i, forest)
        output = parse_session_output("\n".join(lines))
        session.samples.extend(export_samples(forest, output, dataset_metadata={"id": 41, "label": "L"}))
    return group
