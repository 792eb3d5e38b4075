"""How ``python -m relaxtrio serve`` settles its Sessions at Ctrl-C (no engine: the Sessions'
forests are built directly): unused Sessions, export failures and reward errors each stay one
Session's state, and the dump is written for all of them."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest

from relaxtrio.forest import Conversation
from relaxtrio.nursery.group import Group
from relaxtrio.rollout.dumps import load_dump
from relaxtrio.tools.serve import CUT_OFF, NO_REQUESTS, ServeConfig, ServeSummary, finish_serve


def _served(cfg: ServeConfig, outputs: list[Any]) -> list[Group]:
    """One served Group per entry. ``None``: the Session received no request; otherwise it
    committed one turn and its agent wrote ``output`` (a JSON value, or ``...`` for no file)."""
    groups = []
    for i, output in enumerate(outputs):
        group = Group.create(f"serve:group_{i:06d}", num_sessions=1, input_payload={}, timeout_s=math.inf)
        session = group.sessions[0]
        io_dir = cfg.output_dir / f"session_{i}"
        io_dir.mkdir(parents=True)
        if output is not None:
            forest = session.forest
            history = [{"role": "user", "content": f"task {i}"}]
            obs = forest.add_observation(forest.match(Conversation.from_wire(history)), token_ids=[1, 2])
            forest.add_response(obs, {"role": "assistant", "content": "answer"}, token_ids=[3, 4],
                                rollout_logprobs=[-0.5, -0.25], finish_reason="stop", request_id=f"q{i}")
            session.num_requests = 1
            if output is not ...:
                (io_dir / "session_output.json").write_text(json.dumps(output))
        session.status = "running"  # what serve_external_session leaves for the caller to settle
        groups.append(group)
    return groups


def _finish(cfg: ServeConfig, groups: list[Group]) -> ServeSummary:
    return finish_serve(cfg, groups, model_dir=Path("model"), base_url="http://127.0.0.1:1/agentic_api/",
                        stopped_by="SIGINT")


def test_a_session_without_requests_is_reported_as_no_requests(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    cfg = ServeConfig(num_sessions=2, output_dir=tmp_path)
    groups = _served(cfg, [{"reward": 0.5}, None])
    with caplog.at_level(logging.INFO, logger="relaxtrio.tools.serve"):
        summary = _finish(cfg, groups)
    assert (summary.num_sessions, summary.num_samples, summary.failed, summary.no_requests) == (2, 1, 0, 1)
    dump = load_dump(summary.dump_path)
    used, idle = (dump.session(g.sessions[0].session_id) for g in groups)
    assert used["status"] == "completed" and used["reason"] is None
    assert idle["status"] == "cancelled" and idle["reason"] == NO_REQUESTS == "no requests"
    assert idle["forest"]["nodes"] == [] and idle["exported"] == []
    assert "no requests" in caplog.text and "found 0" not in caplog.text and "failed:" not in caplog.text
    assert "0 failed, 1 with no requests" in caplog.text


def test_an_object_reward_without_reward_key_fails_only_its_session(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    cfg = ServeConfig(num_sessions=3, output_dir=tmp_path)
    groups = _served(cfg, [{"reward": {"score": 1.0, "steps": 3}}, {"reward": 0.25}, ...])
    with caplog.at_level(logging.INFO, logger="relaxtrio.tools.serve"):
        summary = _finish(cfg, groups)
    assert (summary.num_samples, summary.failed, summary.no_requests) == (3, 1, 0)
    dump = load_dump(summary.dump_path)
    bad, good, unscored = (dump.session(g.sessions[0].session_id) for g in groups)
    assert bad["status"] == "failed"
    assert "reward is an object (keys: score, steps)" in bad["reason"] and "--reward-key" in bad["reason"]
    assert good["status"] == unscored["status"] == "completed"
    scalars = {d.sample.session_id: d.scalar_reward for d in dump.samples}
    assert scalars == {groups[0].sessions[0].session_id: None, groups[1].sessions[0].session_id: 0.25,
                       groups[2].sessions[0].session_id: None}  # no output file: no reward, no error
    assert [d.sample.reward for d in dump.samples] == [{"score": 1.0, "steps": 3}, 0.25, None]
    assert f"session 0 ({groups[0].sessions[0].session_id}) failed: reward error" in caplog.text


def test_reward_key_picks_the_primary_value_and_names_a_missing_key(tmp_path: Path) -> None:
    cfg = ServeConfig(num_sessions=2, output_dir=tmp_path, reward_key="score")
    groups = _served(cfg, [{"reward": {"score": 1.0, "steps": 3}}, {"reward": {"steps": 2}}])
    summary = _finish(cfg, groups)
    assert summary.failed == 1
    dump = load_dump(summary.dump_path)
    assert [d.scalar_reward for d in dump.samples] == [1.0, None]
    missing = dump.session(groups[1].sessions[0].session_id)
    assert missing["status"] == "failed"
    assert "no key 'score' (keys: steps)" in missing["reason"] and "--reward-key is 'score'" in missing["reason"]


def test_a_strict_export_of_separate_requests_says_what_happened_and_what_to_do(tmp_path: Path) -> None:
    """Three requests that do not continue each other leave three leaves: the default (strict)
    export fails the Session, naming the branching and the ways out, not only the leaf count."""
    cfg = ServeConfig(num_sessions=1, output_dir=tmp_path)
    [group] = _served(cfg, [...])
    forest = group.sessions[0].forest
    for i in (1, 2):  # two more requests, each a new conversation
        obs = forest.add_observation(
            forest.match(Conversation.from_wire([{"role": "user", "content": f"another task {i}"}])),
            token_ids=[1, 5 + i])
        forest.add_response(obs, {"role": "assistant", "content": "answer"}, token_ids=[3, 4],
                            rollout_logprobs=[-0.5, -0.25], finish_reason="stop", request_id=f"r{i}")
    summary = _finish(cfg, [group])
    assert summary.failed == 1
    reason = load_dump(summary.dump_path).session(group.sessions[0].session_id)["reason"]
    assert reason.startswith("export failed: implicit export requires one committed leaf, found 3: "
                             "the Session's requests branched into 3 separate conversations")
    assert "Export explicitly (one named JSONL record per context to train" in reason
    assert "--agentic-export-policy final" in reason and "all-leaves" in reason


def test_a_request_in_flight_at_the_stop_is_reported_as_cut_off_not_as_a_failed_export(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Its agent was waiting for the reply when Ctrl-C closed the Session, so it wrote nothing
    and nothing was committed; a Session that failed to export on its own stays failed."""
    cfg = ServeConfig(num_sessions=3, output_dir=tmp_path)
    groups = _served(cfg, [{"reward": 1.0}, None, None])
    cut, broken = groups[1].sessions[0], groups[2].sessions[0]
    cut.num_requests = cut.num_cancelled_turns = 1  # the close cancelled its only turn
    broken.num_requests = 1  # answered, but nothing committed and no output: a real failure
    with caplog.at_level(logging.INFO, logger="relaxtrio.tools.serve"):
        summary = _finish(cfg, groups)
    assert (summary.num_samples, summary.failed, summary.no_requests, summary.cut_off) == (1, 1, 0, 1)
    dump = load_dump(summary.dump_path)
    cut_record, broken_record = dump.session(cut.session_id), dump.session(broken.session_id)
    assert cut_record["status"] == "cancelled"
    assert cut_record["reason"].startswith(f"{CUT_OFF}; not exported: implicit export requires one committed leaf")
    assert broken_record["status"] == "failed" and broken_record["reason"].startswith("export failed:")
    assert f"session 1 ({cut.session_id}): {CUT_OFF}" in caplog.text
    assert "1 failed, 0 with no requests, 1 cut off mid-request" in caplog.text


def test_the_dump_line_is_singular_for_one() -> None:
    one = ServeSummary(dump_path=Path("d.json"), num_sessions=1, num_samples=1, failed=1, no_requests=1)
    assert one.describe() == "1 session, 1 exported context, 1 failed, 1 with no requests"
    two = ServeSummary(dump_path=Path("d.json"), num_sessions=2, num_samples=0, failed=0)
    assert two.describe() == "2 sessions, 0 exported contexts, 0 failed, 0 with no requests"
