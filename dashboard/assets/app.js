// kvrouter dashboard: polls /ui/api/fleet, /ui/api/decisions and
// /ui/api/series and draws them. Presentation only: every figure comes from
// the API (see API.md); the script keeps just the in-flight history for the
// sparklines. The time series are kept by the server and drawn as plain SVG.
// ?refresh=MS sets the polling interval (default 1000 ms), ?range=5m|15m|1h
// the time range of the charts (default 5m; the buttons change it).
"use strict";

const params = new URLSearchParams(location.search);
const REFRESH = Math.max(100, Number(params.get("refresh")) || 1000);
const HISTORY_MS = 5 * 60 * 1000; // sparkline window
const history = new Map();        // replica id -> [[time ms, in-flight]]
const open = new Set();           // expanded decision ids
let lastDecisions = [];
let lastDecisionsJSON = "";
const RANGES = { "5m": 5 * 60000, "15m": 15 * 60000, "1h": 60 * 60000 };
let range = RANGES[params.get("range")] ? params.get("range") : "5m";

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

// errorRate is failed / finished over the series' range of the columns
// failedKey and doneKey, null when none finished: client requests
// (requests_failed_per_s, requests_finished_per_s) or replica attempts
// (failed_per_s, completed_per_s).
function errorRate(s, failedKey, doneKey) {
  let failed = 0, done = 0;
  for (let i = 0; i < s.t_ms.length; i++) {
    const span = s.span_ms[i] / 1000;
    if (s[failedKey][i] !== null && s[doneKey][i] !== null) {
      failed += s[failedKey][i] * span;
      done += s[doneKey][i] * span;
    }
  }
  return done > 0 ? failed / done : null;
}

function renderHeader(f, s) {
  document.getElementById("policy").textContent = "policy: " + (f.policy || "?");
  document.getElementById("index").textContent = f.index ? "index: " + f.index : "";
  const t = f.totals;
  document.getElementById("totals").replaceChildren(
    card("Replicas", `${t.healthy} / ${t.replicas}`, "healthy / total"),
    card("In flight", int(t.in_flight)),
    card("Run / wait", `${int(t.running)} / ${int(t.waiting)}`, "engine running / waiting"),
    card("Completed", int(t.completed)),
    card("Failed", int(t.requests_failed), `client requests that failed (after any retry), of ${int(t.requests)} finished since the router started; ` +
      `replica attempts: ${int(t.failed)} failed of ${int(t.completed + t.failed)}`),
    card("Error rate", pct(errorRate(s, "requests_failed_per_s", "requests_finished_per_s")),
      `failed / finished client requests over the last ${range} (a request retried on another replica counts once); since the router started: ` +
      pct(t.requests > 0 ? t.requests_failed / t.requests : null)),
    card("Attempt errors", pct(errorRate(s, "failed_per_s", "completed_per_s")),
      `failed / finished attempts on the replicas over the last ${range}, retries included; since the router started: ` +
      pct(t.completed + t.failed > 0 ? t.failed / (t.completed + t.failed) : null)),
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
      el("td", { class: "num runwait", title: r.max_num_seqs ? `runs at most ${r.max_num_seqs} at once (max_num_seqs, ${r.max_num_seqs_source})` : null },
        r.scraped ? `${int(r.running)} / ${int(r.waiting)}` : "—",
        r.max_num_seqs ? el("small", { class: "muted" }, ` of ${int(r.max_num_seqs)}`) : ""),
      el("td", { class: "num" }, int(r.prefill_tokens)),
      el("td", {}, kvBar(r)),
      el("td", { class: "num hit", title: `cached prompt tokens: ${int(r.predicted_cached_tokens)} predicted, ` +
        `${int(r.actual_cached_tokens)} reported, of ${int(r.prompt_tokens)} prompt tokens` },
        `${pct(r.hit_rate_predicted)} / ${pct(r.hit_rate_actual)}`),
      el("td", { class: "num" }, int(r.sessions)),
      el("td", { class: "num completed" }, `${int(r.completed)} / ${int(r.failed)}`),
      el("td", { class: "num" + (r.scrape_errors || (r.scraped && !r.engine) ? " bad" : ""),
        title: r.scrape_error ? `${r.scrape_errors} failed scrapes: ${r.scrape_error}` :
          r.scraped && !r.engine ? "its /metrics has no family kvrouter reads (vllm:, sglang:, llamacpp:): load unknown, read as idle" :
          r.engine ? `engine: ${r.engine}` : null },
        dur(r.load_age_ms) + (r.scrape_errors || (r.scraped && !r.engine) ? " ⚠" : "")),
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
      el("th", { class: "num" }, "Wait ms"), el("th", { class: "num" }, "Import ms"),
      el("th", { class: "num" }, "Load ms"), el("th", { class: "num" }, "Prefill ms"),
      el("th", { class: "num" }, "Decode ms"), el("th", { class: "num" }, "Others ms"),
      el("th", { class: "num" }, "Memory ms"), el("th", { class: "num" }, "Future ms"),
      el("th", { class: "num" }, "Misses ms"), el("th", { class: "num" }, "P(miss)"), el("th", { class: "num" }, "Total ms"))),
    el("tbody", {}, d.candidates.map((c) =>
      el("tr", { class: c.replica === d.replica ? "chosen" : null, title: arithmetic(d, c) },
        el("td", { class: "id" }, c.replica), el("td", { class: "num" }, int(c.matched_tokens)),
        el("td", { class: "num" }, costMS(c.wait_ms)), el("td", { class: "num" }, costMS(c.import_ms)),
        el("td", { class: "num" }, costMS(c.load_ms)), el("td", { class: "num" }, costMS(c.prefill_ms)),
        el("td", { class: "num" }, costMS(c.decode_ms)), el("td", { class: "num" }, costMS(c.others_ms)),
        el("td", { class: "num" }, costMS(c.memory_ms)), el("td", { class: "num" }, costMS(c.future_ms)),
        el("td", { class: "num" }, costMS(c.misses_ms || 0)), el("td", { class: "num" }, (c.miss || 0).toFixed(3)),
        el("td", { class: "num" }, c.score !== undefined && !c.total_ms ? `score ${c.score}` : costMS(c.total_ms))))));
  const parts = [table];
  const w = d.ttft_weight;
  if (w) {
    parts.push(el("div", { class: "formula" }, `Total = ${w} × (Wait + Import + Load + Prefill) + Decode + Others + Memory + Future + Misses` +
      (w > 1 ? `: the time to first token counts ${w} times, as part of the time to the first and to the last token` : "")));
    const chosen = d.candidates.find((c) => c.replica === d.replica);
    if (chosen) parts.push(el("div", { class: "arith" }, arithmetic(d, chosen)));
  }
  if (d.pruned_candidates) parts.push(el("div", { class: "muted pruned" },
    `+ ${int(d.pruned_candidates)} more candidates pruned: a lower bound of their cost already exceeded the chosen one's`));
  return parts.length === 1 ? table : el("div", {}, ...parts);
}

// arithmetic writes candidate c's Total as the sum of its terms, at the
// fewest decimals (1 to 6) at which the terms as written add up to the
// Total as written; null for a candidate without time terms.
function arithmetic(d, c) {
  const w = d.ttft_weight;
  if (!w) return null;
  const ttft = [c.wait_ms, c.import_ms || 0, c.load_ms || 0, c.prefill_ms];
  const rest = [c.decode_ms, c.others_ms, c.memory_ms, c.future_ms, c.misses_ms || 0];
  let dp = 1;
  for (; dp < 6; dp++) {
    const r = (v) => Number(v.toFixed(dp));
    const sum = w * ttft.map(r).reduce((a, b) => a + b) + rest.map(r).reduce((a, b) => a + b);
    if (sum.toFixed(dp) === c.total_ms.toFixed(dp)) break;
  }
  const f = (v) => v.toFixed(dp);
  return `${c.replica}: ${w} × (${ttft.map(f).join(" + ")}) + ${rest.map(f).join(" + ")} = ${f(c.total_ms)} ms`;
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

const SVGNS = "http://www.w3.org/2000/svg";
function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// niceMax is a round upper bound of v for an axis.
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v * 1.0001) return m * p;
  return 10 * p;
}

const rate = (v) => (v === null || v === undefined ? "—" : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0) + "/s");
const fresh = (vs) => { for (let i = vs.length - 1; i >= 0; i--) if (vs[i] !== null && vs[i] !== undefined) return vs[i]; return null; };

// plot draws lines (label, values aligned with s.t_ms, color, dash) of the
// series s into box as an SVG chart over the last s.window_ms: a line breaks
// at a missing value and where a sample follows a pause in polling.
function plot(box, s, lines, opt) {
  const W = Math.max(160, box.clientWidth || 340), H = opt.height || 150;
  const L = opt.compact ? 30 : 46, R = 6, T = 6, B = opt.compact ? 4 : 18;
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": opt.title || "" });
  const n = s.t_ms.length;
  const end = n ? s.t_ms[n - 1] : 0, start = end - s.window_ms;
  let top = opt.max;
  if (!top) top = niceMax(Math.max(0, ...lines.flatMap((l) => l.values.filter((v) => v !== null && v !== undefined))));
  const x = (t) => L + ((t - start) / s.window_ms) * (W - L - R);
  const y = (v) => T + (1 - Math.min(v, top) / top) * (H - T - B);
  for (const f of opt.compact ? [0, 1] : [0, 0.5, 1]) {
    svg.append(svgEl("line", { class: "grid", x1: L, x2: W - R, y1: y(f * top), y2: y(f * top) }));
    svg.append(svgEl("text", { x: L - 4, y: y(f * top) + 3.5, "text-anchor": "end" }, opt.fmt(f * top)));
  }
  if (!opt.compact) {
    const tick = s.window_ms <= 5 * 60000 ? 1 : s.window_ms <= 15 * 60000 ? 3 : 10; // minutes
    for (let m = 0; m * 60000 <= s.window_ms; m += tick) {
      const t = end - m * 60000;
      svg.append(svgEl("text", { x: x(t), y: H - 4, "text-anchor": m === 0 ? "end" : "middle" }, m === 0 ? "now" : `−${m}m`));
    }
  }
  let drawn = 0;
  for (const l of lines) {
    let run = [];
    const flush = () => {
      if (run.length === 1) svg.append(svgEl("circle", { cx: run[0][0], cy: run[0][1], r: 1.8, fill: l.color }));
      else if (run.length > 1) svg.append(svgEl("polyline", { class: l.dash ? "dash" : "", stroke: l.color, points: run.map((p) => p.map((c) => c.toFixed(1)).join(",")).join(" ") }));
      drawn += run.length;
      run = [];
    };
    for (let i = 0; i < n; i++) {
      const v = l.values[i];
      if (s.span_ms[i] > 2.5 * s.step_ms) flush(); // a pause in polling before this sample
      if (v === null || v === undefined) { flush(); continue; }
      run.push([x(s.t_ms[i]), y(v)]);
    }
    flush();
  }
  if (!drawn) svg.append(svgEl("text", { class: "empty", x: (L + W - R) / 2, y: (T + H - B) / 2, "text-anchor": "middle" }, n > 1 ? "no data in the last minutes" : "collecting…"));
  svg.dataset.points = drawn;
  const firstAt = s.t_ms.find((t, i) => lines.some((l) => l.values[i] !== null && l.values[i] !== undefined));
  if (firstAt !== undefined) svg.dataset.oldest = firstAt; // the oldest sample drawn, Unix ms
  const parts = [svg];
  if (!opt.compact) parts.push(el("div", { class: "legend" }, lines.map((l) =>
    el("span", {}, el("i", { class: l.dash ? "dash" : "", style: `border-top-color:${l.color}` }), l.label, el("b", {}, opt.fmt(fresh(l.values)))))));
  box.replaceChildren(...parts);
}

function renderSeries(s) {
  const css = getComputedStyle(document.documentElement);
  const c = (name) => css.getPropertyValue(name).trim();
  const accent = c("--accent"), bad = c("--bad"), good = c("--good"), muted = c("--muted");
  document.getElementById("series-title").textContent = "Last " + { "5m": "5 minutes", "15m": "15 minutes", "1h": "hour" }[range];
  document.getElementById("series-note").textContent =
    `one sample per ${dur(s.step_ms)}, kept by the router; ${s.t_ms.length} samples`;
  for (const b of document.querySelectorAll("#range button")) b.classList.toggle("on", b.dataset.range === range);
  const q = (id) => document.querySelector(`#${id} .plot`);
  plot(q("chart-rate"), s, [
    { label: "routed", values: s.requests_per_s, color: accent },
    { label: "completed", values: s.completed_per_s, color: good },
    { label: "failed", values: s.failed_per_s, color: bad },
  ], { fmt: (v) => (v === null ? "—" : rate(v)), title: "requests per second" });
  plot(q("chart-ttft"), s, [
    { label: "p50", values: s.ttft_p50_ms, color: accent },
    { label: "p99", values: s.ttft_p99_ms, color: bad },
    { label: "predicted p50", values: s.ttft_predicted_p50_ms, color: muted, dash: true },
  ], { fmt: dur, title: "time to first token" });
  plot(q("chart-hit"), s, [
    { label: "actual", values: s.hit_rate_actual, color: accent },
    { label: "predicted", values: s.hit_rate_predicted, color: accent, dash: true },
  ], { fmt: pct, max: 1, title: "hit rate" });
  const minis = s.replicas.map((r) => {
    const box = el("div", { class: "plot" });
    const m = el("div", { class: "mini", "data-replica": r.id },
      el("div", { class: "name", title: r.id }, el("span", { class: "rid" }, r.id), el("b", { title: "last actual / predicted" }, `${pct(fresh(r.hit_rate_actual))} / ${pct(fresh(r.hit_rate_predicted))}`)), box);
    return [m, box, r];
  });
  document.getElementById("replica-hits").replaceChildren(...minis.map((m) => m[0]));
  for (const [, box, r] of minis) {
    plot(box, s, [
      { label: "actual", values: r.hit_rate_actual, color: accent },
      { label: "predicted", values: r.hit_rate_predicted, color: accent, dash: true },
    ], { fmt: pct, max: 1, height: 58, compact: true, title: "hit rate of " + r.id });
  }
}

async function getJSON(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

async function tick() {
  const status = document.getElementById("status");
  let f, d, s;
  try {
    [f, d] = await Promise.all([getJSON("/ui/api/fleet"), getJSON("/ui/api/decisions?n=50")]);
    s = await getJSON("/ui/api/series?range=" + range); // after the fleet's poll, which samples
  } catch (e) {
    status.textContent = "disconnected: retrying";
    status.className = "status stale";
    setTimeout(tick, REFRESH);
    return;
  }
  try {
    record(f);
    renderHeader(f, s);
    renderReplicas(f);
    renderSeries(s);
    const dj = JSON.stringify(d.decisions);
    if (dj !== lastDecisionsJSON) { // keep the table (and any selection) when nothing changed
      lastDecisionsJSON = dj;
      renderDecisions(d.decisions);
    }
    status.textContent = "updated " + clock(f.at);
    status.className = "status";
  } catch (e) {
    console.error("dashboard render:", e); // a bug, not the network: say so
    status.textContent = "render error (see the console)";
    status.className = "status stale";
  }
  setTimeout(tick, REFRESH);
}

for (const b of document.querySelectorAll("#range button")) {
  b.addEventListener("click", () => {
    range = b.dataset.range;
    const u = new URL(location.href);
    u.searchParams.set("range", range);
    window.history.replaceState(null, "", u);
  });
}

tick();
