"""replay's trainer settings: what the dump recorded, on CPU; unknown settings become notes."""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from relaxtrio.config import TrainConfig
from relaxtrio.replay import train_config_of
from relaxtrio.rollout.dumps import DUMP_FORMAT, load_dump, write_dump


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
