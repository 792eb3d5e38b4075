"""Debug dumps and replay: a 1-step tiny run's dump replays with no divergence, a perturbed one
is reported at the perturbed token; rollout only writes the samples without training."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import trio
from tests.support.agents import write_httpx_agent
from tests.support.samples_file import read_samples

from relaxtrio.cli.main import main
from relaxtrio.config import (
    AgentConfig,
    GenerationConfig,
    RolloutConfig,
    TrainRunConfig,
)
from relaxtrio.run.driver import run_training
from relaxtrio.tools.replay import LOGPROB_ATOL, replay_dump
from relaxtrio.rollout.dumps import load_dump
from relaxtrio.train import TrainConfig

pytestmark = pytest.mark.slow  # starts real processes


def _config(tmp_path: Path, tiny_model_dir: Path, **overrides: object) -> TrainRunConfig:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir(exist_ok=True)
    cmd = write_httpx_agent(agent_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"question {i}", "metadata": {"id": i}}) + "\n"
                            for i in range(4)))
    fields: dict = dict(
        prompt_data=data,
        num_rollout=1,
        rollout=RolloutConfig(n_samples_per_prompt=3, rollout_batch_size=2, show_progress=False),
        generation=GenerationConfig(max_response_tokens=8, seed=7),
        agent=AgentConfig(command=f"{cmd} ok", cwd=agent_dir, timeout_s=120,
                          env={"AGENT_TURNS": "2", "AGENT_REWARD": "random"}),
        train=TrainConfig(lr=1e-3),
        hf_checkpoint=tiny_model_dir,
        output_dir=tmp_path / "run",
    )
    fields.update(overrides)
    return TrainRunConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def dumped_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One trained step of the tiny model with a debug dump; returns the dump path."""
    tmp_path = tmp_path_factory.mktemp("dump-run")
    template = str(tmp_path / "dumps" / "rollout_{rollout_id}.json")
    config = _config(tmp_path, tiny_model_dir, debug_rollout_data=template)

    async def run() -> None:
        with trio.fail_after(300):
            summary = await run_training(config)
        assert summary.trained_steps == 1

    trio.run(run)
    return tmp_path / "dumps" / "rollout_0.json"


def test_dump_holds_every_session_forest_and_the_samples(dumped_run: Path) -> None:
    dump = load_dump(dumped_run)
    assert dump.rollout_id == 0
    assert [g["status"] for g in dump.groups] == ["accepted", "accepted"]
    sessions = dump.sessions()
    assert len(sessions) == 6 and len(dump.samples) == 6
    for record in sessions:
        forest = record["forest"]
        kinds = [n["kind"] for n in forest["nodes"]]
        # 2 turns: user, reply, user, reply; the lineage is linear and exported at its leaf.
        assert kinds == ["observation", "response", "observation", "response"]
        assert record["status"] == "completed" and record["reason"] is None
        assert record["turn_count"] == 2 and record["num_requests"] == 2
        assert record["agent"]["return_code"] == 0
        assert record["abort"]["num_aborted"] == 0
        nodes = forest["nodes"]
        assert [n["parent_hash"] for n in nodes] == [None] + [n["state_hash"] for n in nodes[:-1]]
        assert forest["leaves"] == [nodes[-1]["state_hash"]] == record["exported"]
        assert forest["exported"] == record["exported"] and nodes[-1]["exported"]
        assert all(n["num_tokens"] == len(n["token_ids"]) > 0 for n in nodes)
        assert record["weight_versions"] == ["default"]
        assert all(n["weight_versions"] == [{"version": "default", "start": 0, "end": n["num_tokens"]}]
                   for n in nodes if n["kind"] == "response")
    by_session = {s["session_id"]: s for s in sessions}
    for dumped in dump.samples:
        sample = dumped.sample
        record = by_session[sample.session_id]
        assert sample.metadata["agentic_trace"]["leaf_state_hash"] == record["exported"][0]
        tokens = [t for n in record["forest"]["nodes"] for t in n["token_ids"]]
        assert list(sample.token_ids) == tokens
        assert sum(sample.loss_mask) == sum(n["num_tokens"] for n in record["forest"]["nodes"]
                                            if n["kind"] == "response")
        assert dumped.advantage is not None and dumped.scalar_reward is not None
    assert dump.section("train")["loss"] is not None
    assert dump.section("trainer_config")["lr"] == 1e-3


def test_replay_of_a_tiny_run_has_no_divergence(dumped_run: Path, tiny_model_dir: Path) -> None:
    report = replay_dump(load_dump(dumped_run), tiny_model_dir)
    assert report.first is None, report.lines()
    assert report.num_samples == 6 and report.num_trained_tokens > 0
    assert report.logprob_max_abs_diff < LOGPROB_ATOL
    assert report.advantages_checked and report.advantage_max_abs_diff < 1e-9
    assert report.recomputed_loss == pytest.approx(report.recorded_loss, rel=1e-4, abs=1e-6)


def test_a_perturbed_logprob_is_reported_at_its_token(
    dumped_run: Path, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(dumped_run.read_text())
    sample = data["samples"][4]
    token = [t for t, m in enumerate(sample["loss_mask"]) if m][3]  # a token inside a response
    sample["rollout_logprobs"][token] += 0.01
    perturbed = tmp_path / "perturbed.json.gz"
    with gzip.open(perturbed, "wt", encoding="utf-8") as f:
        json.dump(data, f)
    report = replay_dump(load_dump(perturbed), tiny_model_dir)
    first = report.first
    assert first is not None and first.kind == "logprob"
    assert (first.sample, first.token) == (4, token)
    assert first.recorded == pytest.approx(sample["rollout_logprobs"][token])
    assert abs(first.recorded - first.recomputed) == pytest.approx(0.01, abs=LOGPROB_ATOL)
    assert report.num_logprob_divergences == 1
    # The command line reports the same place and exits 1.
    code = main(["replay", str(perturbed), "--checkpoint", str(tiny_model_dir)])
    out = capsys.readouterr().out
    assert code == 1
    assert f"first divergence: logprob at sample 4 (session {sample['session_id']}" in out
    assert f"token {token}: recorded" in out


def test_a_wrong_advantage_is_reported_with_matching_logprobs(dumped_run: Path, tiny_model_dir: Path,
                                                              tmp_path: Path) -> None:
    data = json.loads(dumped_run.read_text())
    data["samples"][2]["advantage"] += 0.5
    wrong = tmp_path / "wrong_credit.json"
    wrong.write_text(json.dumps(data))
    report = replay_dump(load_dump(wrong), tiny_model_dir)
    assert report.num_logprob_divergences == 0
    assert report.first is not None and (report.first.kind, report.first.sample) == ("advantage", 2)


def test_rollout_only_writes_samples_and_trains_nothing(tiny_model_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, tiny_model_dir, rollout_only=True, operator_port=0,
                     rollout=RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, show_progress=False))

    async def run() -> None:
        with trio.fail_after(300):
            summary = await run_training(config)
        assert summary.trained_steps == 0 and summary.checkpoint_dir is None
        assert summary.num_samples == 2

    trio.run(run)
    assert "# operator: dashboard http://127.0.0.1:" in capsys.readouterr().out  # --operator-port 0
    records = list(read_samples(config.rollout_samples_path))
    assert len(records) == 2
    for record in records:
        assert record["rollout_id"] == 0
        assert len(record["token_ids"]) == len(record["loss_mask"]) == len(record["rollout_logprobs"])
        assert record["state_hash"] == record["metadata"]["agentic_trace"]["leaf_state_hash"]
        assert record["name"] is None  # implicit export: the context has no name
        assert isinstance(record["advantage"], float) and isinstance(record["reward"], float)
        assert record["metadata"]["id"] in range(4)
    assert not (tmp_path / "run" / "checkpoint").exists()
