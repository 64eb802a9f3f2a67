// The compare page: every chosen run on shared charts, each series downsampled by the server.
// The template's inline script has already requested the first charts' series (window.compareSeries),
// so the server works while Plotly loads; each chart is drawn, all its runs in one Plotly.react, as
// soon as its series arrive.
(function () {
  const root = document.getElementById("compare");
  if (!root || !window.Plotly) return;
  const charts = [];
  const WEBGL_FROM_RUNS = 50;
  let smoothing = 0, logScale = false;
  const box = document.getElementById("dash-charts");
  // Times are milliseconds since the navigation started (performance.now()'s origin).
  window.compareState = { charts, renderedMs: null };

  async function addChart(key) {
    if (charts.some(c => c.key === key)) return;
    const div = document.createElement("div");
    div.className = "dash-chart";
    div.dataset.key = key;
    box.appendChild(div);
    const chart = { key, div, runs: [] };
    charts.push(chart);
    chart.runs = (await (window.compareSeries[key] || window.compareSeries.request(key))).runs;
    chart.fetchedMs = performance.now();
    await draw(chart);
    chart.drawnMs = performance.now();
  }

  function draw(chart) {
    // WebGL past a few dozen runs: SVG makes one path element per run and chart, which is what a
    // thousand runs cannot afford; below that SVG draws faster on machines without a GPU.
    const type = chart.runs.length > WEBGL_FROM_RUNS ? "scattergl" : "scatter";
    const traces = chart.runs.filter(r => r.x.length).map(r => ({
      type, x: r.x, y: Dash.smooth(r.y, smoothing), name: "#" + r.id + " " + r.name, mode: "lines", line: { width: 1 },
    }));
    const layout = Dash.layout(chart.key, logScale);
    layout.showlegend = traces.length <= 12;
    chart.div.dataset.traces = traces.length;
    return Plotly.react(chart.div, traces, layout, Dash.config);
  }

  document.getElementById("compare-key").addEventListener("change", ev => {
    const key = ev.target.value.trim();
    if (key) { addChart(key); ev.target.value = ""; }
  });
  document.getElementById("dash-smoothing").addEventListener("input", ev => { smoothing = parseFloat(ev.target.value); charts.forEach(draw); });
  document.getElementById("dash-log-scale").addEventListener("change", ev => { logScale = ev.target.checked; charts.forEach(draw); });

  Promise.all(root.dataset.keys.split(",").filter(Boolean).map(addChart)).then(() => {
    window.compareState.renderedMs = performance.now();  // read by bench/dashboard.py, not shown
    document.body.dataset.compareRendered = "1";
  });
})();
