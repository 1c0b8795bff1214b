// Charts shared by the run page and the leaderboard page (uPlot).
const COLORS = ["#2563eb","#dc2626","#16a34a","#d97706","#7c3aed","#0891b2","#db2777","#65a30d","#4b5563","#ea580c","#0d9488","#9333ea"];
const color = i => COLORS[i % COLORS.length];
function width(el) { return Math.max(320, el.clientWidth || 560); }
function fmtMs(v) { return v == null ? "" : v >= 1000 ? (v/1000).toFixed(2) + " s" : v.toFixed(v < 10 ? 1 : 0) + " ms"; }

// cdfChart draws in el the TTFT CDF of each policy of data (a chartData).
function cdfChart(el, data) {
  const tables = data.cdf.map(xy => [xy[0], xy[1]]).filter(t => t[0].length > 0);
  if (!tables.length) { el.textContent = "no completed requests"; return; }
  const names = data.policies.filter((_, i) => data.cdf[i][0].length > 0);
  const joined = uPlot.join(tables);
  new uPlot({
    width: width(el), height: 320,
    scales: { x: { time: false, distr: 3 }, y: { range: [0, 1] } },
    axes: [{ label: "TTFT", values: (u, vs) => vs.map(fmtMs) }, { label: "fraction of requests", values: (u, vs) => vs.map(v => Math.round(v * 100) + "%") }],
    series: [{ label: "TTFT", value: (u, v) => v == null ? "-" : fmtMs(v) }].concat(names.map((n, i) => ({ label: n, stroke: color(data.policies.indexOf(n)), width: 2, spanGaps: true, value: (u, v) => v == null ? "-" : (v * 100).toFixed(1) + "%" }))),
  }, joined, el);
}

// hitChart draws in el each policy's hit rate and prediction against the
// oracles of data.
function hitChart(el, data) {
  const n = data.policies.length;
  if (!n) { el.textContent = "no policies"; return; }
  const xs = data.policies.map((_, i) => i);
  const series = [{ label: "policy", value: (u, v) => v == null ? "-" : data.policies[v] },
    { label: "hit rate", fill: "#2563ebcc", stroke: "#2563eb", paths: uPlot.paths.bars({ size: [0.35, 60], align: -1 }), points: { show: false }, value: (u, v) => v == null ? "-" : (v * 100).toFixed(1) + "%" },
    { label: "predicted", fill: "#93c5fdcc", stroke: "#60a5fa", paths: uPlot.paths.bars({ size: [0.35, 60], align: 1 }), points: { show: false }, value: (u, v) => v == null ? "-" : (v * 100).toFixed(1) + "%" }];
  const rows = [xs, data.hit, data.pred];
  data.oracles.forEach((o, i) => {
    series.push({ label: "oracle " + o.name, stroke: i ? "#16a34a" : "#111827", dash: [6, 4], width: 1.5, points: { show: false }, value: () => (o.hit_rate * 100).toFixed(1) + "%" });
    rows.push(xs.map(() => o.hit_rate));
  });
  new uPlot({
    width: width(el), height: 320,
    scales: { x: { time: false, range: [-0.6, n - 0.4] }, y: { range: [0, 1] } },
    axes: [{ splits: () => xs, values: (u, vs) => vs.map(v => data.policies[v] || ""), rotate: 0, size: 50 },
           { values: (u, vs) => vs.map(v => Math.round(v * 100) + "%") }],
    series: series,
  }, rows, el);
}
