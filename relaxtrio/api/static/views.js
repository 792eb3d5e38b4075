// relaxtrio dashboard views: Session timeline, Group comparison, step view (docs/dashboard.md).
// Loaded before dashboard.js, which calls renderTimeline, renderGroup and renderStepView on
// every refresh. Text from agents goes in as text nodes only (el/svg set textContent).
"use strict";

const TL = { W: 1100, LEFT: 90, ROW_H: 26, TOP: 48, LABEL_W: 80 };

function fmt(value, digits) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "number") return String(value);
  return Number.isInteger(value) ? String(value) : value.toPrecision(digits || 4);
}

function timelineScale(timeline) {
  let end = timeline.now_s || 0;
  for (const r of timeline.requests) for (const s of r.spans) end = Math.max(end, s.end_s);
  for (const e of timeline.events) end = Math.max(end, e.t_s);
  end = Math.max(end, 1e-3);
  return (t) => TL.LEFT + (t / end) * (TL.W - TL.LEFT - 20);
}

function requestTitle(r) {
  const lines = [`${r.request_id}`, `prompt ${fmt(r.prompt_tokens)} tok · completion ${fmt(r.completion_tokens)} tok`,
    `weights ${r.weight_versions.join(", ") || "?"} · aborted ${r.num_aborted}×`,
    r.ended ? `arrived ${fmt(r.arrival_s)} s · ended without an answer: engine call ${r.ended === "error" ? "failed" : "cancelled"}`
      : `arrived ${fmt(r.arrival_s)} s · answered ${fmt(r.committed_s)} s · gap ${fmt(r.gap_s)} s`];
  if (r.shared_prefix) lines.push("shared prefix: later branches continue from this answer");
  for (const s of r.spans) {
    lines.push(s.kind === "engine"
      ? `engine ${fmt(s.start_s)}–${fmt(s.end_s)} s: ${s.output_tokens} tok, w=${s.weight_versions.join(",")}, ${s.finish}`
      : `queued ${fmt(s.start_s)}–${fmt(s.end_s)} s (gate: lease, barrier or pause)`);
  }
  return lines.join("\n");
}

function drawRequest(root, r, x, y) {
  const g = svg("g", { class: "request" + (r.shared_prefix ? " shared" : "") + (r.ended ? " ended " + r.ended : ""),
    "data-request-id": r.request_id, "data-shared-prefix": String(r.shared_prefix), "data-row": r.row,
    "data-ended": r.ended || "" });
  g.append(svg("title", {}, requestTitle(r)));
  for (const s of r.spans) {
    const x0 = x(s.start_s), w = Math.max(2, x(s.end_s) - x0);
    const cls = ["span", s.kind];
    if (s.finish === "abort") cls.push("aborted");
    if (s.finish === "error" || s.finish === "cancelled") cls.push(s.finish);  // the call raised: no answer
    const attrs = { class: cls.join(" "), x: x0, y: y + 3, width: w, height: TL.ROW_H - 8 };
    if (s.kind === "engine") Object.assign(attrs, { "data-weight-versions": s.weight_versions.join(","), "data-finish": s.finish });
    g.append(svg("rect", attrs));
    if (s.kind === "engine") {
      g.append(svg("text", { class: "wv", x: x0 + 2, y: y + TL.ROW_H - 9 }, `w=${s.weight_versions.join(",") || "?"}`));
    }
  }
  if (r.committed_s !== null && r.gap_s !== null) {
    g.append(svg("line", { class: "gap", x1: x(r.committed_s), x2: x(r.committed_s + r.gap_s),
      y1: y + TL.ROW_H / 2, y2: y + TL.ROW_H / 2 }));
  }
  const last = r.spans[r.spans.length - 1];
  if (r.ended && last) {  // a bar end and a cross: this request stopped here, it is not still generating
    const xe = x(last.end_s);
    g.append(svg("line", { class: "end-mark " + r.ended, x1: xe, x2: xe, y1: y + 1, y2: y + TL.ROW_H - 3 }));
    g.append(svg("text", { class: "end-mark " + r.ended, x: xe + 3, y: y + TL.ROW_H - 9 }, r.ended === "error" ? "✕ failed" : "✕ cancelled"));
  }
  if (r.shared_prefix) g.append(svg("text", { class: "shared-mark", x: x(r.arrival_s || 0), y: y + 2 }, "◆ shared"));
  root.append(g);
}

function renderTimeline(timeline) {
  const box = document.getElementById("timeline");
  if (!timeline) { box.textContent = "no timeline"; return; }
  const x = timelineScale(timeline);
  const rows = timeline.rows.length;
  const H = TL.TOP + (rows + 1) * TL.ROW_H + 24;
  const root = svg("svg", { width: TL.W, height: H, "data-requests": timeline.requests.length,
    "data-capacity": timeline.capacity });
  root.append(svg("text", { x: 4, y: TL.TOP + TL.ROW_H / 2 + 4 }, "session"));
  for (let i = 0; i < rows; i++) {
    const y = TL.TOP + (i + 1) * TL.ROW_H;
    root.append(svg("rect", { class: "row-bg", x: TL.LEFT, y, width: TL.W - TL.LEFT - 20, height: TL.ROW_H }));
    root.append(svg("text", { x: 4, y: y + TL.ROW_H / 2 + 4 }, `branch ${i + 1}`));
  }
  const lastX = [-Infinity, -Infinity, -Infinity];  // labels of close events go on three lines
  for (const e of timeline.events) {
    const ex = x(e.t_s);
    let level = lastX.findIndex((lx) => ex - lx >= TL.LABEL_W);
    if (level < 0) level = lastX.indexOf(Math.min(...lastX));
    lastX[level] = ex;
    const fields = Object.entries(e).filter(([k]) => k !== "t_s" && k !== "kind").map(([k, v]) => `${k}=${fmt(v)}`);
    const g = svg("g", { class: "event " + e.kind, "data-kind": e.kind });
    g.append(svg("title", {}, `${e.kind} at ${fmt(e.t_s)} s ${fields.join(" ")}`));
    g.append(svg("line", { x1: ex, x2: ex, y1: TL.TOP, y2: H - 24 }));
    const label = e.kind + (e.rollout_id !== undefined ? ` ${e.rollout_id}` : "") +
      (e.kind === "scored" ? ` r=${fmt(e.reward, 3)}` : "");
    g.append(svg("text", { x: ex + 2, y: 12 + level * 13 }, label));
    root.append(g);
  }
  for (const r of timeline.requests) drawRequest(root, r, x, TL.TOP + (r.row + 1) * TL.ROW_H);
  root.append(svg("text", { x: TL.LEFT, y: H - 6 }, "0 s"));
  root.append(svg("text", { x: TL.W - 80, y: H - 6 }, `${fmt(timeline.now_s, 3)} s`));
  const note = timeline.capacity ? `${timeline.dropped} older events dropped` : "recording off";
  box.replaceChildren(root, el("p", { class: "note" }, note));
}

function renderGroup(detail) {
  const box = document.getElementById("group-view");
  document.getElementById("group-title").textContent =
    `${detail.group_id} · step ${detail.rollout_id}${detail.scored ? " · scored" : ""}`;
  const div = detail.first_divergence;
  const table = el("table", { class: "compare", "data-divergence-message": div.message === null ? "" : div.message,
    "data-divergence-token": div.token === null ? "" : div.token });
  const head = el("tr", {}), stats = [["reward", "reward"], ["advantage", "advantage"], ["turns", "turns"],
    ["tokens", "tokens"], ["response tokens", "response_tokens"], ["status", "status"]];
  head.append(el("th", {}, ""));
  for (const s of detail.sessions) head.append(el("th", { class: "id" }, `#${s.index} ${s.session_id.slice(0, 18)}…`));
  table.append(head);
  for (const [label, key] of stats) {
    const tr = el("tr", { class: "stat", "data-key": key });
    tr.append(el("th", {}, label), ...detail.sessions.map((s) => el("td", { "data-value": s[key] }, fmt(s[key]))));
    table.append(tr);
  }
  const contexts = detail.sessions.map((s) => (s.contexts[0] ? s.contexts[0].messages : []));
  const longest = Math.max(0, ...contexts.map((c) => c.length));
  for (let i = 0; i < longest; i++) {
    const tr = el("tr", { class: "msg" + (i === div.message ? " diverge" : (div.message !== null && i > div.message ? " after" : "")),
      "data-message": i });
    tr.append(el("th", {}, i === div.message ? `${i} ◀ first divergence` : String(i)));
    for (const c of contexts) {
      const m = c[i];
      tr.append(el("td", { class: "text" }, m ? `${m.role}: ${m.text}` : ""));
    }
    table.append(tr);
  }
  const tokenNote = div.token === null ? "token ids agree (or fewer than two exported)" : `first differing token id at ${div.token}`;
  box.replaceChildren(table, el("p", { class: "note" }, tokenNote));
}

const STEP_PARTS = [  // [metrics.jsonl key, label]; wall seconds of the step
  ["rollout_s", "rollout"], ["rollout_slowest_group_wait_s", "… of it waiting for the slowest Group"],
  ["update_s", "update"], ["weight_sync_s", "weight push"], ["eval_s", "eval"], ["step_s", "whole step"]];
const STEP_FIGURES = ["rollout_tokens_per_s", "reward_mean", "num_groups", "num_samples", "aborted_requests",
  "dropped_groups", "interrupted_groups"];

const TEACH_CAUSES = {  // step_cannot_teach_cause → what it means (run.log's WARNING names the remedy)
  no_response_tokens: "no sample has a sampled (loss_mask 1) token",
  zero_advantage: "every Group had identical rewards (or the custom advantage was 0): advantage 0 everywhere",
  all_masked: "the trainer masked every sampled token",
  all_clipped: "the PPO clip was active on every trained token",
  zero_gradient: "the gradient norm was 0"};

function cannotTeach(row) {  // the highlighted notice of a step whose update had no learning signal
  const cause = row.step_cannot_teach_cause || "unknown";
  const box = el("div", { class: "cannot-teach", role: "alert" });
  box.append(el("strong", {}, "this step cannot teach: "),
    el("span", { "data-key": "step_cannot_teach_cause", "data-value": JSON.stringify(cause) }, cause),
    ` (${TEACH_CAUSES[cause] || "see run.log"}); run.log's WARNING names the remedy.`,
    el("span", { hidden: "", "data-key": "step_cannot_teach", "data-value": JSON.stringify(row.step_cannot_teach) }));
  return box;
}

function engineTable(row) {  // keys "<family>/<figure>/<engine>" (e.g. gateway/requests/host:port)
  const engines = new Map(), figures = new Set();
  for (const [key, value] of Object.entries(row)) {
    const parts = key.split("/");
    if (parts.length < 3 || !["engine", "gateway"].includes(parts[0])) continue;
    const figure = parts[0] + "/" + parts[1], engine = parts.slice(2).join("/");
    figures.add(figure);
    if (!engines.has(engine)) engines.set(engine, {});
    engines.get(engine)[figure] = [key, value];
  }
  const table = el("table", { class: "engines" });
  const head = el("tr", {});
  head.append(el("th", {}, "engine"), ...[...figures].map((f) => el("th", {}, f)));
  table.append(head);
  for (const [engine, cells] of engines) {
    const tr = el("tr", {});
    tr.append(el("td", { class: "id" }, engine));
    for (const f of figures) {
      const cell = cells[f];
      tr.append(cell ? el("td", { "data-key": cell[0], "data-value": JSON.stringify(cell[1]) }, fmt(cell[1])) : el("td", {}, ""));
    }
    table.append(tr);
  }
  if (!engines.size) {
    const tr = el("tr", {});
    tr.append(el("td", { colspan: 2 }, "no per-engine figures in this row"));
    table.append(tr);
  }
  return table;
}

function renderStepView(metrics) {
  const box = document.getElementById("step-view");
  if (!metrics.length) { box.textContent = "no finished step yet"; return; }
  const row = metrics[metrics.length - 1];
  document.getElementById("step-title").textContent = `step ${row.step} (metrics.jsonl row ${metrics.length})`;
  const total = row.step_s || 1;
  const bars = el("table", { class: "wall", "data-step": row.step });
  for (const [key, label] of STEP_PARTS) {
    if (row[key] === undefined) continue;
    const tr = el("tr", { "data-key": key });
    const bar = el("div", { class: "bar" + (key === "step_s" ? " total" : "") });
    bar.style.width = `${Math.max(1, Math.min(100, (row[key] || 0) / total * 100))}%`;
    const cell = el("td", { class: "barcell" });
    cell.append(bar);
    tr.append(el("th", {}, label), el("td", { class: "num", "data-key": key, "data-value": JSON.stringify(row[key]) }, `${fmt(row[key])} s`), cell);
    bars.append(tr);
  }
  const figures = el("dl", { class: "figures" });
  for (const key of STEP_FIGURES) {
    if (row[key] === undefined) continue;
    figures.append(el("dt", {}, key), el("dd", { "data-key": key, "data-value": JSON.stringify(row[key]) }, fmt(row[key])));
  }
  const notice = row.step_cannot_teach === 1 ? [cannotTeach(row)] : [];
  box.replaceChildren(...notice, bars, figures, el("h3", {}, "per engine"), engineTable(row),
    el("h3", {}, "wall seconds per step"), stepHistory(metrics));
}

function stepHistory(metrics) {  // the kept rows, newest first, as written in metrics.jsonl
  const table = el("table", { class: "history" });
  const head = el("tr", {});
  head.append(el("th", {}, "step"), ...STEP_PARTS.map(([, label]) => el("th", {}, label)));
  table.append(head);
  for (const row of metrics.slice(-20).reverse()) {
    const marked = row.step_cannot_teach === 1;
    const tr = el("tr", marked ? { "data-step": row.step, class: "cannot-teach",
      title: `cannot teach: ${row.step_cannot_teach_cause}` } : { "data-step": row.step });
    tr.append(el("td", {}, marked ? `${row.step} ⚠` : row.step), ...STEP_PARTS.map(([key]) => el("td", { class: "num" }, fmt(row[key]))));
    table.append(tr);
  }
  return table;
}
