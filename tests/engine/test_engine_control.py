"""Control routes of the embedded engine: abort, pause / continue, weight updates, info routes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import torch
import trio

from relaxtrio.engine.scheduler import Scheduler, SchedulerStatistics
from relaxtrio.engine.server import EngineConfig, load_engine, serve_engine_state
from relaxtrio.models import load_model

PROMPT = [1, 87, 555, 201, 57, 74, 271, 321, 294, 284, 446, 295, 2, 201, 1, 67, 312, 691, 697, 201]
RUNNING_ABORT = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
WAITING_ABORT = {"type": "abort", "message": "Abort in waiting queue"}
STRADDLE_TOKENS: Final = 200


@pytest.fixture(scope="module")
def perturbed_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = load_model(tiny_model_dir)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    out = tmp_path_factory.mktemp("perturbed")
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def perturbed_logprobs(perturbed_dir: Path) -> Callable[..., list[float]]:
    model = load_model(perturbed_dir)

    def compute(prompt: list[int], output_ids: list[int]) -> list[float]:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + output_ids])).logits[0]  # (T, V)
        rows = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # (N, V)
        return rows.gather(1, torch.tensor(output_ids).unsqueeze(1)).squeeze(1).tolist()

    return compute


def _max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


async def _state(http: httpx.AsyncClient) -> dict[str, Any]:
    return (await http.get("/server_info")).json()["internal_states"][0]


async def wait_for_state(
    scheduler: Scheduler, predicate: Callable[[SchedulerStatistics], bool]
) -> SchedulerStatistics:
    """Waits (on the scheduler's change events, no polling) until ``predicate`` holds."""
    with trio.fail_after(30):
        return await scheduler.wait_statistics(predicate)


async def settled(scheduler: Scheduler) -> None:
    """Waits until the scheduler loop has handled everything and parked: from then on nothing
    happens until the next request or control call, so a negative can be asserted."""
    with trio.fail_after(30):  # an engine that keeps working (e.g. decodes while paused) fails
        await scheduler.wait_settled()


class Pending:
    """A /generate call running in the background; ``body`` is set when it returns."""

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None
        self.done = trio.Event()
        self.finished_at = 0.0

    async def run(self, http: httpx.AsyncClient, payload: dict[str, Any]) -> None:
        r = await http.post("/generate", json=payload)
        assert r.status_code == 200, r.text
        self.body = r.json()
        self.finished_at = trio.current_time()
        self.done.set()


def start(nursery: trio.Nursery, http: httpx.AsyncClient, rid: str, max_new_tokens: int = 3000,
          prompt: list[int] = PROMPT) -> Pending:
    pending = Pending()
    payload = {"rid": rid, "input_ids": prompt, "return_logprob": True,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                   "ignore_eos": True}}
    nursery.start_soon(pending.run, http, payload)
    return pending


async def finished(pending: Pending) -> dict[str, Any]:
    with trio.fail_after(60):
        await pending.done.wait()
    assert pending.body is not None
    rows = pending.body["meta_info"]["output_token_logprobs"]
    assert [row[1] for row in rows] == pending.body["output_ids"]
    return pending.body


def _logprobs(body: dict[str, Any]) -> list[float]:
    return [row[0] for row in body["meta_info"]["output_token_logprobs"]]


async def test_abort_running_request_returns_partial_output(
    http: httpx.AsyncClient, nursery: trio.Nursery, scheduler: Scheduler, reference_logprobs: Callable
) -> None:
    pending = start(nursery, http, "run-1")
    await wait_for_state(scheduler, lambda s: s.num_running_reqs == 1 and s.num_generated_tokens > 5)
    r = await http.post("/abort_request", json={"rid": "run-1"})
    assert r.status_code == 200 and r.content == b""
    body = await finished(pending)
    assert body["meta_info"]["finish_reason"] == RUNNING_ABORT
    ids = body["output_ids"]
    assert 5 < len(ids) < 3000 and body["meta_info"]["completion_tokens"] == len(ids)
    assert body["meta_info"]["prompt_tokens"] == len(PROMPT)
    assert _max_diff(_logprobs(body), reference_logprobs(PROMPT, ids)) < 1e-4


async def test_abort_waiting_request_and_abort_all(nursery: trio.Nursery, tiny_model_dir: Path) -> None:
    config = EngineConfig(model_path=tiny_model_dir, max_running_requests=1)
    state = await load_engine(config)
    scheduler = state.scheduler
    url = await nursery.start(serve_engine_state, state, config)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        running = start(nursery, http, "A")
        await wait_for_state(scheduler, lambda s: s.num_running_reqs == 1)
        queued = start(nursery, http, "B")
        await wait_for_state(scheduler, lambda s: s.num_waiting_reqs == 1)
        await http.post("/abort_request", json={"rid": "B"})
        body = await finished(queued)
        assert body["meta_info"]["finish_reason"] == WAITING_ABORT
        assert body["output_ids"] == [] and body["text"] == ""
        assert body["meta_info"]["completion_tokens"] == 0
        assert "prompt_tokens" not in body["meta_info"] and "cached_tokens" not in body["meta_info"]
        assert not running.done.is_set()
        for payload in ({"rid": "unknown"}, {"rid": ""}, {}):
            r = await http.post("/abort_request", json=payload)
            assert r.status_code == 200 and r.content == b""
        assert (await _state(http))["num_running_reqs"] == 1
        await http.post("/abort_request", json={"abort_all": True})
        assert (await finished(running))["meta_info"]["finish_reason"] == RUNNING_ABORT


async def test_duplicate_in_flight_rid_is_rejected(
    http: httpx.AsyncClient, nursery: trio.Nursery, scheduler: Scheduler
) -> None:
    pending = start(nursery, http, "dup")
    await wait_for_state(scheduler, lambda s: s.num_running_reqs == 1)
    r = await http.post("/generate", json={"rid": "dup", "input_ids": PROMPT})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "Duplicate request ID detected: dup"}}
    await http.post("/abort_request", json={"rid": "dup"})
    await finished(pending)
    r = await http.post("/generate", json={"rid": "dup", "input_ids": PROMPT,
                                           "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200  # the rid is free again once the first call returned


async def test_pause_abort_blocks_new_requests_until_continue(
    http: httpx.AsyncClient, nursery: trio.Nursery, scheduler: Scheduler
) -> None:
    pending = start(nursery, http, "p1")
    await wait_for_state(scheduler, lambda s: s.num_running_reqs == 1)
    r = await http.post("/pause_generation", json={"mode": "abort"})
    assert r.json() == {"message": "Generation paused successfully.", "status": "ok"}
    assert pending.done.is_set()  # mode abort returns only after the aborts have drained
    assert (await finished(pending))["meta_info"]["finish_reason"] == RUNNING_ABORT
    assert (await http.get("/ready")).status_code == 503
    later = start(nursery, http, "p2", max_new_tokens=4)
    await wait_for_state(scheduler, lambda s: s.num_waiting_reqs == 1)
    await settled(scheduler)  # the loop has seen p2 and parked: paused, it admits nothing
    assert not later.done.is_set()
    assert (await _state(http))["num_waiting_reqs"] == 1
    r = await http.post("/continue_generation", json={})
    assert r.json() == {"message": "Generation continued successfully.", "status": "ok"}
    assert (await finished(later))["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert (await http.get("/ready")).status_code == 200


@pytest.mark.parametrize("mode", ["retract", "in_place"])
async def test_pause_keeps_progress_and_resumes(
    http: httpx.AsyncClient, nursery: trio.Nursery, scheduler: Scheduler,
    reference_logprobs: Callable, mode: str,
) -> None:
    pending = start(nursery, http, "keep", max_new_tokens=1000)
    await wait_for_state(scheduler, lambda s: s.num_generated_tokens > 10)
    await http.post("/pause_generation", json={"mode": mode})
    frozen = await _state(http)
    assert frozen["num_running_reqs"] == (0 if mode == "retract" else 1)
    assert frozen["num_waiting_reqs"] == (1 if mode == "retract" else 0)
    await settled(scheduler)  # parked while paused: no step runs until continue
    assert (await _state(http))["num_generated_tokens"] == frozen["num_generated_tokens"]
    assert not pending.done.is_set()
    await http.post("/continue_generation", json={})
    body = await finished(pending)
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 1000}
    assert body["meta_info"]["num_retractions"] == (1 if mode == "retract" else 0)
    assert body["meta_info"]["weight_versions"] == [{"version": "default", "start": 0, "end": 1000}]
    assert _max_diff(_logprobs(body), reference_logprobs(PROMPT, body["output_ids"])) < 1e-4


async def test_update_weights_changes_logprobs_and_version(
    http: httpx.AsyncClient, perturbed_dir: Path, perturbed_logprobs: Callable,
    reference_logprobs: Callable,
) -> None:
    payload = {"input_ids": PROMPT, "return_logprob": True,
               "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
    before = (await http.post("/generate", json=payload)).json()
    r = await http.post("/update_weights_from_disk",
                        json={"model_path": str(perturbed_dir), "weight_version": "v2"})
    assert r.status_code == 200
    assert r.json() == {"success": True, "num_paused_requests": 0,
                        "message": "Succeeded to update model weights. Weight version updated to v2."}
    after = (await http.post("/generate", json=payload)).json()
    assert after["meta_info"]["weight_version"] == "v2"
    assert after["meta_info"]["weight_versions"] == [{"version": "v2", "start": 0, "end": 8}]
    ids = after["output_ids"]
    assert _max_diff(_logprobs(after), perturbed_logprobs(PROMPT, ids)) < 1e-4
    assert _max_diff(_logprobs(after), reference_logprobs(PROMPT, ids)) > 1e-2
    assert _max_diff(_logprobs(before), reference_logprobs(PROMPT, before["output_ids"])) < 1e-4
    info = (await http.get("/model_info")).json()
    assert info["weight_version"] == "v2" and info["model_path"] == str(perturbed_dir)


async def test_update_while_retracted_splits_versions(
    http: httpx.AsyncClient, nursery: trio.Nursery, scheduler: Scheduler, perturbed_dir: Path,
    perturbed_logprobs: Callable, reference_logprobs: Callable,
) -> None:
    # STRADDLE_TOKENS leaves the request running long after the pause is sent (it is sent once
    # 20 tokens exist), and stays short enough that the whole request, which holds one HTTP read
    # open from start to end, finishes well inside the client's timeout on a loaded machine.
    pending = start(nursery, http, "straddle", max_new_tokens=STRADDLE_TOKENS)
    await wait_for_state(scheduler, lambda s: s.num_generated_tokens > 20)
    await http.post("/pause_generation", json={"mode": "retract"})
    r = await http.post("/update_weights_from_disk",
                        json={"model_path": str(perturbed_dir), "weight_version": "v2"})
    assert r.json()["success"] is True
    # Paused, the update applied at once: it did not wait for the retracted request, which
    # cannot finish before continue_generation.
    assert not pending.done.is_set()
    await http.post("/continue_generation", json={})
    body = await finished(pending)
    spans = body["meta_info"]["weight_versions"]
    k = spans[0]["end"]
    assert 20 < k < STRADDLE_TOKENS
    assert spans == [{"version": "default", "start": 0, "end": k},
                     {"version": "v2", "start": k, "end": STRADDLE_TOKENS}]
    assert body["meta_info"]["weight_version"] == "v2"
    ids, logprobs = body["output_ids"], _logprobs(body)
    # Old tokens were sampled by the old weights; after the retraction the sequence was
    # re-prefilled, so the new tokens see the new weights over the whole prefix.
    assert _max_diff(logprobs[:k], reference_logprobs(PROMPT, ids)[:k]) < 1e-4
    assert _max_diff(logprobs[k:], perturbed_logprobs(PROMPT, ids)[k:]) < 1e-4


async def test_update_without_pause_waits_for_running_requests(
    http: httpx.AsyncClient, nursery: trio.Nursery, scheduler: Scheduler, perturbed_dir: Path
) -> None:
    first = start(nursery, http, "old", max_new_tokens=1000)
    await wait_for_state(scheduler, lambda s: s.num_running_reqs == 1)
    update_done: list[float] = []
    updated = trio.Event()

    async def update() -> None:
        r = await http.post("/update_weights_from_disk",
                            json={"model_path": str(perturbed_dir), "weight_version": "v2"})
        assert r.json()["success"] is True
        update_done.append(trio.current_time())
        updated.set()

    nursery.start_soon(update)
    await wait_for_state(scheduler, lambda s: s.weight_update_pending)
    second = start(nursery, http, "new", max_new_tokens=5)
    old_body, new_body = await finished(first), await finished(second)
    assert old_body["meta_info"]["finish_reason"] == {"type": "length", "length": 1000}
    assert [s["version"] for s in old_body["meta_info"]["weight_versions"]] == ["default"]
    assert [s["version"] for s in new_body["meta_info"]["weight_versions"]] == ["v2"]
    with trio.fail_after(10):
        await updated.wait()
    assert first.finished_at <= update_done[0] <= second.finished_at


async def test_update_with_abort_all_and_bad_path(
    http: httpx.AsyncClient, nursery: trio.Nursery, scheduler: Scheduler, perturbed_dir: Path,
    tmp_path: Path,
) -> None:
    pending = start(nursery, http, "victim")
    await wait_for_state(scheduler, lambda s: s.num_running_reqs == 1)
    r = await http.post("/update_weights_from_disk",
                        json={"model_path": str(perturbed_dir), "abort_all_requests": True})
    assert r.json()["success"] is True
    assert (await finished(pending))["meta_info"]["finish_reason"] == RUNNING_ABORT
    # No weight_version given: the label stays.
    assert (await http.get("/model_info")).json()["weight_version"] == "default"
    for path in (tmp_path / "missing", tmp_path):
        r = await http.post("/update_weights_from_disk", json={"model_path": str(path)})
        assert r.status_code == 400
        assert r.json()["success"] is False and r.json()["num_paused_requests"] == 0
        assert r.json()["message"]


async def test_update_weight_version_aborts_by_default(
    http: httpx.AsyncClient, nursery: trio.Nursery, scheduler: Scheduler
) -> None:
    pending = start(nursery, http, "relabel-1")
    await wait_for_state(scheduler, lambda s: s.num_running_reqs == 1)
    r = await http.post("/update_weight_version", json={"new_version": "v3"})
    assert r.json() == {"success": True, "message": "Weight version updated to v3", "new_version": "v3"}
    assert (await finished(pending))["meta_info"]["finish_reason"] == RUNNING_ABORT

    pending = start(nursery, http, "relabel-2", max_new_tokens=1000)
    await wait_for_state(scheduler, lambda s: s.num_generated_tokens > 10 and s.num_running_reqs == 1)
    await http.post("/update_weight_version", json={"new_version": "v4", "abort_all_requests": False})
    body = await finished(pending)
    versions = body["meta_info"]["weight_versions"]
    assert [s["version"] for s in versions] == ["v3", "v4"]
    assert versions[0]["start"] == 0 and versions[0]["end"] == versions[1]["start"]
    assert versions[1]["end"] == 1000


@pytest.mark.parametrize(
    "path",
    ["/abort_request", "/pause_generation", "/continue_generation", "/update_weights_from_disk",
     "/update_weight_version", "/close_session"],
)
async def test_control_routes_need_a_json_body(http: httpx.AsyncClient, path: str) -> None:
    r = await http.post(path)
    assert r.status_code == 400
    body = r.json()
    assert body["object"] == "error" and body["code"] == 400 and "Field required" in body["message"]


async def test_info_and_health_routes(http: httpx.AsyncClient, tiny_model_dir: Path) -> None:
    for path in ("/health", "/health_generate", "/ready"):
        r = await http.get(path)
        assert r.status_code == 200 and r.content == b"", path
    for path in ("/model_info", "/get_model_info"):
        info = (await http.get(path)).json()
        assert info["model_path"] == str(tiny_model_dir) and info["is_generation"] is True
        assert info["tokenizer_path"] == str(tiny_model_dir) and info["weight_version"] == "default"
    for path in ("/server_info", "/get_server_info"):
        info = (await http.get(path)).json()
        assert info["context_length"] == 4096 and info["max_req_input_len"] == 4090
        assert info["max_total_num_tokens"] == 4 * 4096 and isinstance(info["version"], str)
        assert "max_batch_size_seen" in info["internal_states"][0]
    assert (await http.get("/v1/models")).json()["data"][0]["max_model_len"] == 4096
    assert (await http.get("/flush_cache")).status_code == 200
    assert (await http.post("/flush_cache")).status_code == 200
    r = await http.post("/close_session", json={"session_id": "s1"})
    assert r.status_code == 200 and r.content == b""
    metrics = (await http.get("/metrics")).text
    assert "sglang:max_total_num_tokens" in metrics and "sglang:num_queue_reqs" in metrics
    r = await http.post("/pause_generation", json={})  # default mode abort
    assert r.status_code == 200
    assert (await http.get("/ready")).status_code == 503
    await http.post("/continue_generation", json={})
    r = await http.post("/pause_generation", json={"mode": "sideways"})
    assert r.status_code == 400
    r = await http.get("/no_such_route")
    assert r.status_code == 404 and r.json()["code"] == 404


async def test_failed_model_step_is_a_500_and_the_engine_recovers(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relaxtrio.engine._batch import DecodeBatch

    real_step = DecodeBatch.step
    calls = []

    def flaky_step(self: DecodeBatch, last_token_ids: list[int]) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected fault")
        return real_step(self, last_token_ids)

    monkeypatch.setattr(DecodeBatch, "step", flaky_step)
    payload = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 10, "ignore_eos": True}}
    r = await http.post("/generate", json=payload)
    assert r.status_code == 500
    body = r.json()
    assert body["object"] == "error" and body["code"] == 500 and "injected" not in body["message"]
    r = await http.post("/generate", json=payload)
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 10
