// relaxtrio operator dashboard: plain JS + SVG, no dependencies (docs/dashboard.md).
// The operator token comes from the URL fragment (#token=...&session=...), which the browser
// never sends to a server; every data request carries it as a bearer header. Everything an agent
// wrote (messages) is inserted as text nodes only, never as HTML.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const params = new URLSearchParams(location.hash.slice(1));
const token = params.get("token") || "";
let selected = params.get("session");
let selectedGroup = params.get("group");
const refreshMs = Number(document.body.dataset.refreshMs) || 2000;

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

async function getJSON(path) {
  const response = await fetch(path, { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try { message = (await response.json()).error.message; } catch (e) { /* keep the status */ }
    throw new Error(message);
  }
  return response.json();
}

function fillList(dl, record) {
  dl.replaceChildren();
  for (const [k, v] of Object.entries(record || {})) {
    dl.append(el("dt", {}, k), el("dd", {}, v));
  }
}

function renderState(state) {
  document.getElementById("kind").textContent = state.kind;
  fillList(document.getElementById("totals"), state.totals);
  fillList(document.getElementById("pipeline"), state.pipeline || { pipeline: "none (serve)" });
  const agents = document.getElementById("agents");
  agents.replaceChildren(...state.live_agents.map(
    (a) => el("li", {}, `pgid ${a.pgid} · ${a.group_id} · ${a.session_id.slice(0, 16)}…`)));
  if (!state.live_agents.length) agents.append(el("li", {}, "none"));
  const body = document.querySelector("#groups tbody");
  body.replaceChildren();
  for (const group of state.groups) {
    const row = el("tr", { class: "group", "data-group-id": group.group_id });
    if (group.group_id === selectedGroup) row.classList.add("selected");
    row.addEventListener("click", () => { selectedGroup = group.group_id; refresh(); });
    const sum = (key) => group.sessions.reduce((total, s) => total + s[key], 0);
    row.append(el("td", { class: "id", title: group.dropped_reason || "" }, group.group_id),
      el("td", {}, group.state), el("td", {}, group.rollout_id), el("td", {}, sum("turn_count")),
      el("td", {}, sum("num_requests")), el("td", {}, sum("num_aborted")),
      el("td", {}, group.inflight_request_count), el("td", {}, sum("forest_nodes")),
      el("td", {}, `${group.live_process_count} live`));
    body.append(row);
    for (const s of group.sessions) {
      const srow = el("tr", { class: "session", "data-session-id": s.session_id });
      if (s.session_id === selected) srow.classList.add("selected");
      const agent = s.agent_alive ? `pgid ${s.agent_pgid}` :
        (s.agent_return_code !== null ? `exit ${s.agent_return_code}` : "—");
      srow.append(el("td", { class: "id", title: s.reason || "" }, `#${s.index} ${s.session_id}`),
        el("td", {}, s.status), el("td", {}, ""), el("td", {}, s.turn_count),
        el("td", {}, s.num_requests), el("td", {}, s.num_aborted), el("td", {}, s.inflight_rids.length),
        el("td", {}, s.forest_nodes), el("td", {}, agent));
      srow.addEventListener("click", () => { selected = s.session_id; selectedGroup = group.group_id; refresh(); });
      body.append(srow);
    }
  }
  if (!selected) {  // show the first Session with a forest until the operator picks one
    const first = state.groups.flatMap((g) => g.sessions).find((s) => s.forest_nodes > 0);
    if (first) selected = first.session_id;
  }
  if (!selectedGroup || !state.groups.some((g) => g.group_id === selectedGroup)) {
    const owner = state.groups.find((g) => g.sessions.some((s) => s.session_id === selected));
    selectedGroup = owner ? owner.group_id : (state.groups[0] || {}).group_id;
  }
}

const BOX_W = 150, BOX_H = 44, GAP_X = 16, GAP_Y = 28;

function layoutForest(nodes) {
  const byHash = new Map(nodes.map((n) => [n.state_hash, n]));
  const children = new Map(nodes.map((n) => [n.state_hash, []]));
  const roots = [];
  for (const n of nodes) {
    if (n.parent_hash && byHash.has(n.parent_hash)) children.get(n.parent_hash).push(n);
    else roots.push(n);
  }
  const pos = new Map();
  let nextX = 0;
  const place = (node, level) => {  // leaves left to right; a parent centred over its children
    const kids = children.get(node.state_hash);
    let x;
    if (!kids.length) { x = nextX; nextX += 1; } else {
      const xs = kids.map((k) => place(k, level + 1));
      x = (xs[0] + xs[xs.length - 1]) / 2;
    }
    pos.set(node.state_hash, { x, y: level });
    return x;
  };
  roots.forEach((r) => place(r, 0));
  return { pos, children, width: Math.max(nextX, 1) };
}

function nodeLabel(n) {
  const kind = n.kind === "response" ? "resp" : "obs";
  const first = `${kind} · ${n.num_tokens} tok`;
  if (n.kind === "response") {
    const versions = (n.weight_versions || []).map((s) => s.version).filter((v, i, a) => a.indexOf(v) === i);
    return [first, `w=${versions.join(",") || "?"} ${n.finish_reason || ""}`.trim()];
  }
  return [first, `${n.messages.length} msg${n.has_multimodal ? " +media" : ""}`];
}

function renderForest(record) {
  const box = document.getElementById("forest");
  const forest = record.forest;
  document.getElementById("forest-title").textContent =
    `${record.session_id} · ${forest.num_nodes} nodes · ${forest.leaves.length} leaves · ` +
    `${forest.exported.length} exported · ${record.status}`;
  const { pos, width } = layoutForest(forest.nodes);
  const depth = Math.max(0, ...[...pos.values()].map((p) => p.y)) + 1;
  const W = width * (BOX_W + GAP_X) + GAP_X, H = depth * (BOX_H + GAP_Y) + GAP_Y;
  const root = svg("svg", { width: W, height: H, "data-num-nodes": forest.num_nodes });
  const cx = (p) => GAP_X + p.x * (BOX_W + GAP_X) + BOX_W / 2;
  const top = (p) => GAP_Y / 2 + p.y * (BOX_H + GAP_Y);
  for (const n of forest.nodes) {
    const parent = n.parent_hash && pos.get(n.parent_hash);
    if (!parent) continue;
    const p = pos.get(n.state_hash);
    root.append(svg("line", { class: "edge", x1: cx(parent), y1: top(parent) + BOX_H, x2: cx(p), y2: top(p) }));
  }
  for (const n of forest.nodes) {
    const p = pos.get(n.state_hash);
    const classes = ["node", n.kind];
    if (n.leaf) classes.push("leaf");
    if (n.exported) classes.push("exported");
    const g = svg("g", { class: classes.join(" "), "data-state-hash": n.state_hash,
      transform: `translate(${cx(p) - BOX_W / 2},${top(p)})` });
    const preview = n.messages.map((m) => `${m.role}: ${typeof m.content === "string" ? m.content : JSON.stringify(m.content)}`);
    g.append(svg("title", {}, `${n.state_hash}\n${preview.join("\n").slice(0, 2000)}`));
    g.append(svg("rect", { width: BOX_W, height: BOX_H }));
    nodeLabel(n).forEach((line, i) => g.append(svg("text", { x: 6, y: 16 + i * 15 }, line)));
    root.append(g);
  }
  box.replaceChildren(root);
}

function linePlot(title, steps, key) {
  const W = 300, H = 160, L = 44, B = 24, T = 18;
  const points = steps.filter((s) => s[key] !== null && s[key] !== undefined);
  const plot = svg("svg", { class: "plot", width: W, height: H, "data-key": key, "data-points": points.length });
  plot.append(svg("text", { x: L, y: 12 }, title));
  if (!points.length) { plot.append(svg("text", { x: L, y: H / 2 }, "no finished step yet")); return plot; }
  const xs = points.map((s) => s.step), ys = points.map((s) => s[key]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(0, ...ys), y1 = Math.max(...ys, y0 + 1e-9);
  const sx = (x) => L + (x1 === x0 ? (W - L - 10) / 2 : (x - x0) / (x1 - x0) * (W - L - 10));
  const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - B - T);
  plot.append(svg("polyline", { points: points.map((s) => `${sx(s.step)},${sy(s[key])}`).join(" ") }));
  points.forEach((s) => plot.append(svg("circle", { cx: sx(s.step), cy: sy(s[key]), r: 3 })));
  plot.append(svg("text", { x: 2, y: sy(y1) + 4 }, Number(y1.toPrecision(3))));
  plot.append(svg("text", { x: 2, y: sy(y0) + 4 }, Number(y0.toPrecision(3))));
  plot.append(svg("text", { x: L, y: H - 6 }, `step ${x0}`));
  plot.append(svg("text", { x: W - 50, y: H - 6 }, `step ${x1}`));
  return plot;
}

function renderSteps(steps) {
  document.getElementById("plots").replaceChildren(
    linePlot("reward (mean)", steps, "reward_mean"),
    linePlot("step time (s)", steps, "step_s"),
    linePlot("generated tokens/s", steps, "tokens_per_s"));
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    renderState(await getJSON("/debug_state"));
    const steps = await getJSON("/debug_state/steps");
    renderSteps(steps.steps);
    renderStepView(steps.metrics);
    if (selected) {
      try {
        const record = await getJSON("/debug_state/sessions/" + encodeURIComponent(selected));
        renderForest(record);
        renderTimeline(record.timeline);
      } catch (err) {  // e.g. a Session no longer shown: keep the rest of the page live
        document.getElementById("forest").textContent = "forest unavailable: " + err.message;
      }
    }
    if (selectedGroup) {
      try {
        renderGroup(await getJSON("/debug_state/groups/" + encodeURIComponent(selectedGroup)));
      } catch (err) {
        document.getElementById("group-view").textContent = "group unavailable: " + err.message;
      }
    }
    status.textContent = "updated " + new Date().toLocaleTimeString();
    status.className = "";
    document.body.dataset.loaded = "true";
  } catch (err) {
    status.textContent = "refresh failed: " + err.message;
    status.className = "error";
  }
}

refresh();
setInterval(refresh, refreshMs);
