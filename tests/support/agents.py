"""Agent programs for tests, written to disk and run as real subprocesses (``bash -lc``)."""

from __future__ import annotations

import sys
from pathlib import Path

PYTHON = sys.executable

# A plain-httpx agent: `turns` chat calls with a growing history, then writes its output.
HTTPX_AGENT = r'''
import json, os, sys, time
import httpx

task = json.load(open(os.environ["RELAX_INPUT_JSON"]))
meta = task.get("metadata", {})
mode = meta.get("mode") or (sys.argv[1] if len(sys.argv) > 1 else "ok")
turns = int(meta.get("turns", os.environ.get("AGENT_TURNS", "1")))
max_tokens = meta.get("max_tokens")
messages = task["messages"] or [{"role": "user", "content": "hello"}]
if mode == "wait_file":
    while not os.path.exists(meta.get("wait_file") or os.environ["AGENT_WAIT_FILE"]):
        time.sleep(0.02)
if mode == "sigkill":
    os.kill(os.getpid(), 9)
if mode == "crash_before":
    print("agent crashed before its first request", file=sys.stderr)
    sys.exit(1)
if mode == "silent":
    sys.exit(0)
url = os.environ["RELAX_BASE_URL"].rstrip("/") + "/v1/chat/completions"
headers = {"Authorization": "Bearer " + os.environ["RELAX_SESSION_ID"]}
with httpx.Client(timeout=600) as client:
    for turn in range(turns):
        body = {"model": "m", "messages": messages}
        if max_tokens:
            body["max_tokens"] = max_tokens
        r = client.post(url, json=body, headers=headers)
        if r.status_code != 200:
            print("HTTP", r.status_code, r.text, file=sys.stderr)
            sys.exit(2)
        messages.append(r.json()["choices"][0]["message"])
        if turn + 1 < turns:
            messages.append({"role": "user", "content": f"continue {turn}"})
            time.sleep(float(meta.get("tool_s", 0)))  # a tool call between two turns
if mode == "answer_then_wait_file":
    # Answers first, then keeps its Session open until the file exists: releasing it ends the
    # Session at once, with no engine work left to race against other Sessions' generations.
    while not os.path.exists(meta.get("wait_file") or os.environ["AGENT_WAIT_FILE"]):
        time.sleep(0.02)
if mode == "grandchildren":
    # After its first request (so the Session is in Runtime and its budget runs), the agent
    # leaves descendants behind and hangs.
    import subprocess
    for _ in range(2):
        child = subprocess.Popen(["bash", "-c", "sleep 3600 & echo $! >> " + os.environ["AGENT_PID_FILE"] + "; wait"])
        open(os.environ["AGENT_PID_FILE"], "a").write(f"{child.pid}\n")
    time.sleep(3600)
if mode == "multi":
    # One Session, three contexts: the main conversation above and two searcher conversations.
    records = [{"name": "main", "messages": messages, "metadata": {"outcome": 1.0}, "reward": 1.0}]
    with httpx.Client(timeout=600) as client:
        for i in range(2):
            history = [{"role": "user", "content": f"search {i}"}]
            r = client.post(url, json={"model": "m", "messages": history}, headers=headers)
            history.append(r.json()["choices"][0]["message"])
            records.append({"name": f"searcher_{i}", "messages": history,
                            "metadata": {"usefulness": 0.25 * (i + 1)}})
    open(os.environ["RELAX_OUTPUT_JSON"], "w").write("\n".join(json.dumps(r) for r in records))
    sys.exit(0)
if mode == "branching":
    # mini-swe-agent drops a reply it cannot parse and resends the history plus a format error
    # (each retry a new branch); opencode asks for a title with its own system prompt, last.
    with httpx.Client(timeout=600) as client:
        for retry in range(2):
            history = messages[:-1] + [{"role": "user", "content": f"format error {retry}: use one bash block"}]
            client.post(url, json={"model": "m", "messages": history}, headers=headers).raise_for_status()
        title = [{"role": "system", "content": "Generate a short title."}, messages[0]]
        client.post(url, json={"model": "m", "messages": title}, headers=headers).raise_for_status()
    open(os.environ["RELAX_OUTPUT_JSON"], "w").write(json.dumps({"reward": 1.0}))
    sys.exit(0)
if mode == "hang":
    import subprocess
    subprocess.Popen(["sleep", "3600"])
    open(os.environ["AGENT_PID_FILE"], "a").write(f"{os.getpid()}\n")
    time.sleep(3600)
if mode == "crash_after":
    print("boom after the request", file=sys.stderr)
    sys.exit(7)
out = os.environ["RELAX_OUTPUT_JSON"]
if mode == "array_output":
    open(out, "w").write("[1, 2]")
elif mode == "garbage_output":
    open(out, "w").write("{{{ not json")
else:
    reward = os.environ.get("AGENT_REWARD", "1.0")
    if reward == "none":  # leave scoring to a reward model
        reward = None
    elif reward == "random":
        reward = float(hash(os.environ["RELAX_SESSION_ID"]) % 1000) / 1000
    elif reward == "content":  # deterministic: a function of the model's last reply only
        reward = float(sum(map(ord, messages[-1].get("content") or "")) % 101) / 100
    else:
        reward = float(reward)
    open(out, "w").write(json.dumps({"reward": reward, "metadata": {
        "mode": mode, "rollout_mode": os.environ["RELAX_ROLLOUT_MODE"],
        "group_id": os.environ["RELAX_GROUP_ID"]}}))
'''


def write_httpx_agent(directory: Path) -> str:
    """Writes the httpx agent into ``directory``; returns the command that runs it (append a mode)."""
    (directory / "httpx_agent.py").write_text(HTTPX_AGENT)
    return f"{PYTHON} httpx_agent.py"
