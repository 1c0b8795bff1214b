// Charts shared by the run page and the leaderboard page (uPlot). Colours
// come with the data: data.colors per policy (kv-aware always the same
// red, drawn thicker), data.palette for replicas.
function width(el) { return Math.max(320, el.clientWidth || 560); }
function fmtMs(v) { return v == null ? "" : v >= 1000 ? (v/1000).toFixed(2) + " s" : v.toFixed(v < 10 ? 1 : 0) + " ms"; }

// cdfChart draws in el the TTFT CDF of each policy of data (a chartData).
function cdfChart(el, data) {
  const idx = data.policies.map((_, i) => i).filter(i => data.cdf[i][0].length > 0);
  if (!idx.length) { el.textContent = "no completed requests"; return; }
  const joined = uPlot.join(idx.map(i => [data.cdf[i][0], data.cdf[i][1]]));
  new uPlot({
    width: width(el), height: 360,
    scales: { x: { time: false, distr: 3 }, y: { range: [0, 1] } },
    axes: [{ label: "TTFT", values: (u, vs) => vs.map(fmtMs) }, { label: "fraction of requests", values: (u, vs) => vs.map(v => Math.round(v * 100) + "%") }],
    // A legend entry is its policy's name; the value beside it appears
    // only while the cursor is on the chart.
    series: [{ label: "TTFT", value: (u, v) => v == null ? "" : fmtMs(v) }].concat(idx.map(i => ({
      label: data.policies[i], stroke: data.colors[i], width: data.policies[i] === "kv-aware" ? 3 : 1.5, spanGaps: true,
      value: (u, v) => v == null ? "" : (v * 100).toFixed(1) + "%" }))),
  }, joined, el);
}

// attainChart draws in el the share of requests meeting the SLO against
// load, one curve per policy of data (an attainData), with each level as
// a dashed horizontal line. The x axis is log-scaled unless data.linear;
// data.xlabel and data.xname, when set, name it (else: load).
function attainChart(el, data) {
  const idx = data.policies.map((_, i) => i).filter(i => data.curves[i][0].length > 0);
  if (!idx.length) { el.textContent = "no runs"; return; }
  const joined = uPlot.join(idx.map(i => [data.curves[i][0], data.curves[i][1]]));
  const lines = data.levels.map(l => joined[0].map(() => l));
  const share = (u, v) => v == null ? "" : (v * 100).toFixed(1) + "%";
  new uPlot({
    width: width(el), height: 360,
    scales: { x: { time: false, distr: data.linear ? 1 : 3, log: 2, range: (u, lo, hi) => [lo, hi] }, y: { range: [0, 1.02] } },
    axes: [{ label: data.xlabel || "load (1 = a balanced fleet caching nothing at its knee)" }, { label: "requests meeting the SLO", values: (u, vs) => vs.map(v => Math.round(v * 100) + "%") }],
    series: [{ label: data.xname || "load", value: (u, v) => v == null ? "" : v.toPrecision(3) }].concat(idx.map(i => ({
      label: data.policies[i], stroke: data.colors[i], width: data.policies[i] === "kv-aware" ? 3 : 1.5, spanGaps: true,
      points: { show: true, size: 5 }, value: share }))).concat(data.levels.map(l => ({
      label: Math.round(l * 1000) / 10 + "% level", stroke: "#6b7280", dash: [6, 4], width: 1, points: { show: false }, value: share }))),
  }, joined.concat(lines), el);
}
