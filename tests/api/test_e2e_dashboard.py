"""The live dashboard in headless Chromium, against a running rollout step.

A real rollout step (tiny model on the embedded engine, the real pipeline and agent API) runs
two Groups of two Sessions. Each agent makes two turns, then a branch from its first state
(6 forest nodes, 2 leaves), and waits for a file before exporting its main line, so the
Sessions stay open while the browser looks. One Chromium (Debian's ``chromium`` through
Selenium and ``chromium-driver``) loads the dashboard from the operator listener: the page lists
every Group, the selected Session's tree has one box per forest node (and the exported leaves
marked once the step is over), another Session is selected by a click, and after the step the
reward plot has its point. A screenshot is saved under the test's temporary directory.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from tests.support.apps import serve_agent_api
from tests.support.pipeline import prompts
from tests.support.waits import wait_until

from relaxtrio.api.operator import start_operator
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import AgentConfig, GenerationConfig, RolloutConfig
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.models import load_tokenizer
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.rollout.operator_view import RunView
from relaxtrio.rollout.pipeline import open_rollout_pipeline
from relaxtrio.rollout.turns import EngineTurnHandler
from tests.support.fleets import open_fleet_of_one

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
# CI sets RELAXTRIO_REQUIRE_BROWSER=1 (.ci/run): there a missing browser fails instead of skipping.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    (CHROMIUM is None or CHROMEDRIVER is None) and os.environ.get("RELAXTRIO_REQUIRE_BROWSER") != "1",
    reason="needs Debian's chromium and chromium-driver (scripts/install_browser.sh)")]

NODES_PER_SESSION = 6  # obs, resp, obs, resp on the main line; obs, resp on the branch

# Two turns, a branch from the first state, then a wait; then the main line as its one context.
HOLD_AGENT = r'''
import json, os, time
import httpx

task = json.load(open(os.environ["RELAX_INPUT_JSON"]))
url = os.environ["RELAX_BASE_URL"].rstrip("/") + "/v1/chat/completions"
headers = {"Authorization": "Bearer " + os.environ["RELAX_SESSION_ID"]}

def turn(client, messages):
    r = client.post(url, json={"model": "m", "messages": messages, "max_tokens": 4}, headers=headers)
    r.raise_for_status()
    return messages + [r.json()["choices"][0]["message"]]

with httpx.Client(timeout=600) as client:
    main = turn(client, list(task["messages"]))
    main = turn(client, main + [{"role": "user", "content": "and then?"}])
    branch = turn(client, main[:2] + [{"role": "user", "content": "try another way"}])
while not os.path.exists(os.environ["HOLD_FILE"]):
    time.sleep(0.05)
# Only the main line is trained on: the branch stays in the forest, not exported.
open(os.environ["RELAX_OUTPUT_JSON"], "w").write(json.dumps({"name": "main", "messages": main, "reward": 1.0}))
'''

PAGE_STATE = """
const q = (s) => [...document.querySelectorAll(s)];
return {
  loaded: document.body.dataset.loaded === "true",
  status: document.getElementById("status").textContent,
  groups: q("#groups tr.group").map((e) => e.dataset.groupId),
  sessions: q("#groups tr.session").map((e) => e.dataset.sessionId),
  title: document.getElementById("forest-title").textContent,
  svg_nodes: Number((document.querySelector("#forest svg") || {dataset: {}}).dataset.numNodes || -1),
  nodes: q("#forest svg g.node").length,
  responses: q("#forest svg g.node.response").length,
  exported: q("#forest svg g.node.exported").length,
  edges: q("#forest svg line.edge").length,
  reward_points: Number((document.querySelector('svg.plot[data-key="reward_mean"]') || {dataset: {}}).dataset.points || -1),
};
"""


class _Browser:
    """One headless Chromium session (blocking Selenium calls: run them in a worker thread)."""

    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        options = Options()
        options.binary_location = CHROMIUM or ""
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1400", "--disable-extensions", "--no-first-run"):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))

    def wait_for(self, url: str | None, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Loads ``url`` (unless None), then polls the page state until ``ready`` holds (30 s)."""
        from selenium.webdriver.support.ui import WebDriverWait

        if url is not None:
            self.driver.get(url)
        seen: list[dict[str, Any]] = []

        def check(driver: Any) -> bool:
            seen.append(driver.execute_script(PAGE_STATE))
            return ready(seen[-1])

        try:
            WebDriverWait(self.driver, 30, poll_frequency=0.2).until(check)
        except Exception as exc:
            raise AssertionError(f"page never got ready; last state {seen[-1:]}") from exc
        return seen[-1]

    def click_session(self, session_id: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver.find_element(By.CSS_SELECTOR, f'tr.session[data-session-id="{session_id}"]').click()

    def screenshot(self, path: Path) -> None:
        assert self.driver.save_screenshot(str(path))

    def quit(self) -> None:
        self.driver.quit()


async def _wait_state(url: str, token: str, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    state: dict[str, Any] = {}

    async def holds() -> bool:
        state.update((await http.get(url + "/debug_state", headers={"Authorization": f"Bearer {token}"})).json())
        return ready(state)

    async with httpx.AsyncClient(timeout=30) as http:  # the agents are real processes
        await wait_until(holds, timeout_s=300, what="the dashboard state", interval_s=0.1)
    return state


async def test_dashboard_in_headless_chromium_shows_groups_and_forest_of_a_live_rollout(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    assert CHROMIUM and CHROMEDRIVER, "chromium and chromedriver must be on PATH (scripts/install_browser.sh)"
    hold = tmp_path / "release-agents"
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    (agent_dir / "hold_agent.py").write_text(HOLD_AGENT)
    agent = AgentConfig(command=f"{sys.executable} hold_agent.py", cwd=agent_dir,
                        env={"HOLD_FILE": str(hold)}, timeout_s=120, term_grace_s=0.5)
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=2, show_progress=False)
    compiler = ChatCompiler(load_tokenizer(tiny_model_dir))
    registry = SessionRegistry()
    view = RunView(kind="rollout")
    lines: list[str] = []
    browser: _Browser | None = None
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            engine_url = await nursery.start(serve_engine, EngineConfig(model_path=tiny_model_dir,
                                                                        max_running_requests=8))
            async with open_fleet_of_one(engine_url) as client:
                handler = EngineTurnHandler(client=client, compiler=compiler,
                                            config=GenerationConfig(max_response_tokens=4, seed=5))
                async with serve_agent_api(registry, handler) as base_url, open_rollout_pipeline(
                        config=config, agent=agent, registry=registry, handler=handler,
                        base_url=base_url, prompts=prompts([{}, {}])) as pipeline:
                    view.attach(pipeline)
                    operator_url = await start_operator(nursery, view, port=0, announce=lines.append)
                    token = lines[0].split("#token=")[1].split()[0]
                    results: list[Any] = []
                    stepped = trio.Event()

                    async def run_step() -> None:
                        result = await pipeline.run_step(0, last=True)
                        view.note_step(result, step_s=result.rollout_s)
                        results.append(result)
                        stepped.set()

                    nursery.start_soon(run_step)
                    state = await _wait_state(operator_url, token, lambda s: s["totals"]["session_count"] == 4 and all(
                        x["forest_nodes"] == NODES_PER_SESSION for g in s["groups"] for x in g["sessions"]))
                    group_ids = sorted(g["group_id"] for g in state["groups"])
                    sessions = [x["session_id"] for g in state["groups"] for x in g["sessions"]]
                    assert state["totals"]["live_process_count"] == 4
                    assert state["pipeline"]["runtime_reward_group_count"] == 2
                    assert state["pipeline"]["resident_group_count"] == 2
                    started = time.monotonic()
                    try:
                        browser = await trio.to_thread.run_sync(_Browser)
                        page = await trio.to_thread.run_sync(
                            browser.wait_for, f"{operator_url}/dashboard#token={token}&session={sessions[0]}",
                            lambda p: p["loaded"] and p["nodes"] > 0 and len(p["groups"]) == 2)
                        assert sorted(page["groups"]) == group_ids
                        assert sorted(page["sessions"]) == sorted(sessions)
                        assert sessions[0] in page["title"]
                        assert page["nodes"] == page["svg_nodes"] == NODES_PER_SESSION
                        assert page["responses"] == 3 and page["edges"] == NODES_PER_SESSION - 1
                        await trio.to_thread.run_sync(browser.click_session, sessions[3])
                        page = await trio.to_thread.run_sync(
                            browser.wait_for, None, lambda p: sessions[3] in p["title"])
                        assert page["nodes"] == NODES_PER_SESSION

                        hold.write_text("go")  # agents write their contexts and exit; the step ends
                        await stepped.wait()
                        assert len(results[0].groups) == 2 and len(results[0].samples) == 4
                        page = await trio.to_thread.run_sync(
                            browser.wait_for, None, lambda p: p["reward_points"] == 1 and p["exported"] == 1)
                        assert page["nodes"] == NODES_PER_SESSION and sorted(page["groups"]) == group_ids
                        shot = tmp_path / "dashboard.png"
                        await trio.to_thread.run_sync(browser.screenshot, shot)
                        assert shot.stat().st_size > 10_000
                        print(f"dashboard screenshot: {shot} (browser part {time.monotonic() - started:.1f} s)")
                    finally:
                        if browser is not None:
                            await trio.to_thread.run_sync(browser.quit)
            nursery.cancel_scope.cancel()
