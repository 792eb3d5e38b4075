"""Dump files: the path template, writing (plain and gzip), loading, and Session records."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from tests.support.samples_file import read_samples

from relaxtrio import ConfigError
from relaxtrio.nursery.group import Group
from relaxtrio.rollout.dumps import (
    DUMP_FORMAT,
    append_samples,
    check_dump_template,
    dump_path,
    group_record,
    load_dump,
    write_dump,
)


def test_the_template_needs_rollout_id_and_nothing_else() -> None:
    assert check_dump_template("d/rollout_{rollout_id}.json") == "d/rollout_{rollout_id}.json"
    assert dump_path("d/rollout_{rollout_id}.json", 3) == Path("d/rollout_3.json")
    with pytest.raises(ConfigError, match="must contain {rollout_id}"):
        check_dump_template("d/rollout.json")
    with pytest.raises(ConfigError, match="may use only"):
        check_dump_template("d/{rollout_id}_{step}.json")


@pytest.mark.parametrize("name", ["dump.json", "dump.json.gz"])
def test_a_written_dump_loads_back(tmp_path: Path, name: str) -> None:
    payload = {"format": DUMP_FORMAT, "rollout_id": 2, "groups": [], "samples": [],
               "train": {"loss": 0.5, "entropy": math.nan}, "path": tmp_path}
    path = write_dump(tmp_path / "sub" / name, payload)
    assert not list(path.parent.glob("*.tmp*"))
    dump = load_dump(path)
    assert dump.rollout_id == 2 and dump.samples == () and dump.groups == ()
    assert dump.section("train") == {"loss": 0.5, "entropy": None}  # NaN is written as null
    assert dump.data["path"] == str(tmp_path)
    if name.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            assert json.load(f)["rollout_id"] == 2


def test_load_refuses_what_is_not_a_dump(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="invalid JSON"):
        load_dump(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ConfigError, match="format 1 .found 99"):
        load_dump(tmp_path / "other.json")
    (tmp_path / "sample.json").write_text(json.dumps({"format": DUMP_FORMAT, "samples": [{"name": None}]}))
    with pytest.raises(ConfigError, match=r"samples\[0\] is not a valid sample") as info:
        load_dump(tmp_path / "sample.json")
    assert info.value.param == "samples[0]"


def test_samples_files_append_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    assert append_samples(path, 0, [{"a": 1}, {"a": math.inf}]) == 2
    assert append_samples(path, 1, [{"a": 3}]) == 1
    assert list(read_samples(path)) == [{"rollout_id": 0, "a": 1}, {"rollout_id": 0, "a": None},
                                        {"rollout_id": 1, "a": 3}]


def test_a_group_that_never_ran_is_recorded_with_empty_forests() -> None:
    group = Group.create("train:group_000001", num_sessions=2, input_payload={"messages": []},
                         timeout_s=10.0, prompt_index=5, dataset_metadata={"id": 5})
    group.drop("step closed before the group finished (not needed this step)")
    record = group_record(group, status="dropped")
    json.dumps(record, allow_nan=False)
    assert record["status"] == "dropped" and record["prompt_index"] == 5
    assert record["dropped_reason"].startswith("step closed")
    first = record["sessions"][0]
    assert first["status"] == "pending" and first["turn_count"] == 0 and first["exported"] == []
    assert first["forest"]["nodes"] == [] and first["dataset_metadata"] == {"id": 5}
    assert first["agent"] == {"return_code": None}
