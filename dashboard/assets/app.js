// kvrouter dashboard: polls /ui/api/fleet and /ui/api/decisions and draws
// them. Presentation only: every figure comes from the API (see API.md);
// the script keeps just the in-flight history for the sparklines.
// ?refresh=MS sets the polling interval (default 1000 ms).
"use strict";

const params = new URLSearchParams(location.search);
const REFRESH = Math.max(100, Number(params.get("refresh")) || 1000);
const HISTORY_MS = 5 * 60 * 1000; // sparkline window
const history = new Map();        // replica id -> [[time ms, in-flight]]
const open = new Set();           // expanded decision ids
let lastDecisions = [];
let lastDecisionsJSON = "";

// el builds an element; children are nodes or strings (set as text, never HTML).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "onclick") e.addEventListener("click", v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

const int = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
const pct = (f) => (f === null || f === undefined ? "—" : (100 * f).toFixed(1) + "%");
const known = (n) => (n === null || n === undefined || n < 0 ? "—" : int(n));
function dur(msv) {
  if (msv === null || msv === undefined) return "—";
  if (msv < 1) return msv.toFixed(2) + " ms";
  if (msv < 1000) return msv.toFixed(msv < 10 ? 1 : 0) + " ms";
  if (msv < 60000) return (msv / 1000).toFixed(2) + " s";
  return (msv / 60000).toFixed(1) + " min";
}
const costMS = (v) => (v === null || v === undefined ? "—" : v.toFixed(1));
function clock(iso) {
  const d = new Date(iso);
  if (isNaN(d)) return "—";
  const p = (n, w) => String(n).padStart(w, "0");
  return `${p(d.getHours(), 2)}:${p(d.getMinutes(), 2)}:${p(d.getSeconds(), 2)}.${p(d.getMilliseconds(), 3)}`;
}

function card(label, value, title) {
  return el("div", { class: "card", title }, el("div", { class: "label" }, label), el("div", { class: "value" }, value));
}

function renderHeader(f) {
  document.getElementById("policy").textContent = "policy: " + (f.policy || "?");
  document.getElementById("index").textContent = f.index ? "index: " + f.index : "";
  const t = f.totals;
  document.getElementById("totals").replaceChildren(
    card("Replicas", `${t.healthy} / ${t.replicas}`, "healthy / total"),
    card("In flight", int(t.in_flight)),
    card("Run / wait", `${int(t.running)} / ${int(t.waiting)}`, "engine running / waiting"),
    card("Completed", int(t.completed)),
    card("Failed", int(t.failed)),
    card("Sessions", int(f.sessions)),
    card("Decisions", int(f.decisions)),
    card("Hit rate", `${pct(t.hit_rate_actual)}`, "actual (engine-reported) cached / prompt tokens"),
    card("Predicted", `${pct(t.hit_rate_predicted)}`, "router-predicted cached / prompt tokens"),
    card("Cached tokens", `${int(t.predicted_cached_tokens)} / ${int(t.actual_cached_tokens)}`, "predicted / actual"),
  );
}

function record(f) {
  const now = Date.now();
  const seen = new Set();
  for (const r of f.replicas) {
    seen.add(r.id);
    const h = history.get(r.id) || [];
    h.push([now, r.in_flight]);
    while (h.length && h[0][0] < now - HISTORY_MS) h.shift();
    history.set(r.id, h);
  }
  for (const id of history.keys()) if (!seen.has(id)) history.delete(id);
}

function sparkline(id, width, height) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const h = history.get(id) || [];
  const base = document.createElementNS(ns, "line");
  base.setAttribute("x1", 0); base.setAttribute("x2", width);
  base.setAttribute("y1", height - 0.5); base.setAttribute("y2", height - 0.5);
  svg.append(base);
  if (h.length > 1) {
    const end = h[h.length - 1][0], start = h[0][0], span = Math.max(1, end - start);
    const top = Math.max(1, ...h.map((p) => p[1]));
    const pts = h.map(([t, v]) => `${(((t - start) / span) * width).toFixed(1)},${(height - 1 - (v / top) * (height - 3)).toFixed(1)}`);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.append(line);
    const title = document.createElementNS(ns, "title");
    title.textContent = `max ${top} in flight over the last ${Math.round((end - h[0][0]) / 1000)} s`;
    svg.append(title);
  }
  return svg;
}

function kvBar(r) {
  if (!r.scraped) return el("span", { class: "muted" }, "—");
  const u = Math.min(1, Math.max(0, r.kv_usage));
  const cls = u >= 0.95 ? "fill full" : u >= 0.8 ? "fill high" : "fill";
  return el("div", { class: "kv" },
    el("div", { class: "bar" }, el("div", { class: cls, style: `width:${(100 * u).toFixed(1)}%` })),
    el("span", {}, pct(u)));
}

function eventsCell(e) {
  if (!e) return el("span", { class: "muted" }, "n/a");
  let badge;
  if (!e.connected) badge = el("span", { class: "badge down" }, "disconnected");
  else if (e.fallback) badge = el("span", { class: "badge warn" }, "fallback");
  else badge = el("span", { class: "badge up" }, "live");
  const title = `last event ${e.last_event_age_ms === null ? "never" : dur(e.last_event_age_ms) + " ago"}; ` +
    `${int(e.gaps)} gaps, ${int(e.replays)} replays, ${int(e.resets)} resets`;
  return el("span", { title }, badge, " ",
    el("small", { class: "muted" }, `gaps ${int(e.gaps)} · resets ${int(e.resets)}`));
}

function renderReplicas(f) {
  const rows = f.replicas.map((r) =>
    el("tr", { "data-replica": r.id },
      el("td", { class: "id", title: r.id },
        el("span", { class: "badge " + (r.healthy ? "up" : "down") }, r.healthy ? "healthy" : "down"), " ",
        r.draining ? el("span", { class: "badge warn", title: "takes no new requests; those in flight finish" }, "draining") : "",
        r.draining ? " " : "", r.id),
      el("td", { class: "num" }, el("div", { class: "trend" }, sparkline(r.id, 90, 20), el("span", { class: "inflight" }, int(r.in_flight)))),
      el("td", { class: "num" }, r.scraped ? `${int(r.running)} / ${int(r.waiting)}` : "—"),
      el("td", { class: "num" }, int(r.prefill_tokens)),
      el("td", {}, kvBar(r)),
      el("td", { class: "num hit", title: `cached prompt tokens: ${int(r.predicted_cached_tokens)} predicted, ` +
        `${int(r.actual_cached_tokens)} reported, of ${int(r.prompt_tokens)} prompt tokens` },
        `${pct(r.hit_rate_predicted)} / ${pct(r.hit_rate_actual)}`),
      el("td", { class: "num" }, int(r.sessions)),
      el("td", { class: "num completed" }, `${int(r.completed)} / ${int(r.failed)}`),
      el("td", { class: "num" + (r.scrape_errors ? " bad" : ""), title: r.scrape_error ? `${r.scrape_errors} failed scrapes: ${r.scrape_error}` : null },
        dur(r.load_age_ms) + (r.scrape_errors ? " ⚠" : "")),
      el("td", { class: "events" }, eventsCell(r.events)),
    ));
  if (!rows.length) rows.push(el("tr", {}, el("td", { class: "empty", colspan: 10 }, "no replicas")));
  document.querySelector("#replicas tbody").replaceChildren(...rows);
}

function costs(d) {
  if (!d.candidates.length) return el("span", { class: "muted" }, `no cost terms (policy ${d.policy || "?"}, reason ${d.reason})`);
  const table = el("table", { class: "inner" },
    el("thead", {}, el("tr", {},
      el("th", {}, "Candidate"), el("th", { class: "num" }, "Matched tok"),
      el("th", { class: "num" }, "Wait ms"), el("th", { class: "num" }, "Prefill ms"),
      el("th", { class: "num" }, "Decode ms"), el("th", { class: "num" }, "Others ms"),
      el("th", { class: "num" }, "Memory ms"),
      el("th", { class: "num" }, "Total ms"))),
    el("tbody", {}, d.candidates.map((c) =>
      el("tr", { class: c.replica === d.replica ? "chosen" : null },
        el("td", { class: "id" }, c.replica), el("td", { class: "num" }, int(c.matched_tokens)),
        el("td", { class: "num" }, costMS(c.wait_ms)), el("td", { class: "num" }, costMS(c.prefill_ms)),
        el("td", { class: "num" }, costMS(c.decode_ms)), el("td", { class: "num" }, costMS(c.others_ms)),
        el("td", { class: "num" }, costMS(c.memory_ms)),
        el("td", { class: "num" }, c.score !== undefined && !c.total_ms ? `score ${c.score}` : costMS(c.total_ms))))));
  if (!d.pruned_candidates) return table;
  return el("div", {}, table, el("div", { class: "muted pruned" },
    `+ ${int(d.pruned_candidates)} more candidates pruned: a lower bound of their cost already exceeded the chosen one's`));
}

function toggle(id) {
  if (open.has(id)) open.delete(id); else open.add(id);
  renderDecisions(lastDecisions);
}

function renderDecisions(ds) {
  lastDecisions = ds;
  const rows = [];
  for (const d of ds) {
    const isOpen = open.has(d.id);
    const prompt = d.prompt_tokens >= 0 ? int(d.prompt_tokens) : "~" + int(d.tokens);
    rows.push(el("tr", { class: "decision" + (isOpen ? " open" : ""), "data-id": d.id, onclick: () => toggle(d.id) },
      el("td", {}, clock(d.at)),
      el("td", { class: "id" }, d.id),
      el("td", { class: "id" }, d.session || "—"),
      el("td", { class: "id" }, d.replica || "—"),
      el("td", {}, d.reason),
      el("td", { class: "num" }, `${known(d.predicted_cached_tokens)} / ${known(d.actual_cached_tokens)}`),
      el("td", { class: "num" }, prompt),
      el("td", { class: "num" }, `${d.predicted_ttft_ms ? dur(d.predicted_ttft_ms) : "—"} / ${d.ttft_ms ? dur(d.ttft_ms) : "—"}`),
      el("td", { class: "outcome-" + d.outcome }, d.outcome),
    ));
    if (isOpen) rows.push(el("tr", { class: "costs" }, el("td", { colspan: 9 }, costs(d))));
  }
  for (const id of open) if (!ds.some((d) => d.id === id)) open.delete(id);
  if (!rows.length) rows.push(el("tr", {}, el("td", { class: "empty", colspan: 9 }, "no decisions yet")));
  document.querySelector("#decisions tbody").replaceChildren(...rows);
}

async function getJSON(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

async function tick() {
  const status = document.getElementById("status");
  try {
    const [f, d] = await Promise.all([getJSON("/ui/api/fleet"), getJSON("/ui/api/decisions?n=50")]);
    record(f);
    renderHeader(f);
    renderReplicas(f);
    const dj = JSON.stringify(d.decisions);
    if (dj !== lastDecisionsJSON) { // keep the table (and any selection) when nothing changed
      lastDecisionsJSON = dj;
      renderDecisions(d.decisions);
    }
    status.textContent = "updated " + clock(f.at);
    status.className = "status";
  } catch (e) {
    status.textContent = "disconnected: retrying";
    status.className = "status stale";
  }
  setTimeout(tick, REFRESH);
}

tick();
