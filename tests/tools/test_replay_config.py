"""replay's recorded settings: the trainer's on CPU (unknown ones become notes) and the estimator."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from tests.support.groups import sample

from relaxtrio.config import TrainConfig
from relaxtrio.tools.replay import replay_dump, train_config_of
from relaxtrio.rollout.dumps import DUMP_FORMAT, load_dump, sample_record, write_dump


def _dump(tmp_path: Path, **sections: object):
    return load_dump(write_dump(tmp_path / "d.json", {"format": DUMP_FORMAT, "rollout_id": 0,
                                                     "groups": [], "samples": [], **sections}))


def test_the_recorded_trainer_settings_are_used_on_cpu(tmp_path: Path) -> None:
    recorded = json.loads(json.dumps(attrs.asdict(TrainConfig(lr=1e-3, micro_batch_size=2, seed=9,
                                                              device="cuda"))))
    config, notes = train_config_of(_dump(tmp_path, trainer_config={**recorded, "from_the_future": 1}))
    assert config == TrainConfig(lr=1e-3, micro_batch_size=2, seed=9, device="cpu")
    assert notes == ["recorded trainer settings unknown to this version, ignored: from_the_future"]


def test_a_rollout_only_dump_gets_trainer_defaults(tmp_path: Path) -> None:
    config, notes = train_config_of(_dump(tmp_path, generation={"temperature": 0.7, "seed": 3}))
    fields = attrs.fields_dict(TrainConfig)
    assert config.seed == TrainConfig().seed  # the sampling seed is not the trainer's seed
    if "temperature" in fields:  # trainers that compute logprobs at the rollout temperature
        assert config.temperature == 0.7
    assert notes == ["the dump has no trainer settings (rollout only): trainer defaults used"]


@pytest.mark.parametrize(
    ("rollout_config", "credits"),
    [
        ({"advantage_estimator": "rloo", "grpo_std_normalization": True},
         [-4 / 3, -4 / 3, 4 / 3, 4 / 3]),  # 0 - (0 + 2 + 2) / 3, 2 - (0 + 0 + 2) / 3
        ({"advantage_estimator": "grpo", "grpo_std_normalization": False}, [-1.0, -1.0, 1.0, 1.0]),
        ({}, [-1 / (1 + 1e-6), -1 / (1 + 1e-6), 1 / (1 + 1e-6), 1 / (1 + 1e-6)]),  # no estimator
        # recorded: GRPO, (r - 1) / (std 1 + eps 1e-6)
    ],
)
def test_advantages_are_recomputed_with_the_recorded_estimator(
        tmp_path: Path, tiny_model_dir: Path, rollout_config: dict, credits: list[float]) -> None:
    rewards = [0.0, 0.0, 2.0, 2.0]
    records = [sample_record(sample(r, session_id=f"s{i}"), group_id="g", index=i, scalar_reward=r,
                             advantage=a) for i, (r, a) in enumerate(zip(rewards, credits, strict=True))]
    report = replay_dump(_dump(tmp_path, samples=records, rollout_config=rollout_config), tiny_model_dir)
    assert report.advantages_checked and report.advantage_max_abs_diff < 1e-12
    assert all(d.kind != "advantage" for d in report.divergences)
