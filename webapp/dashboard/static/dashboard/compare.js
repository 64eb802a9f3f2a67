// The compare page: every chosen run on shared charts, each series downsampled by the server.
// The template's inline script has already requested the first charts' series (window.compareSeries),
// so the server works while Plotly loads; each chart is drawn, all its runs in one Plotly.react, as
// soon as its series arrive.
(function () {
  const root = document.getElementById("compare");
  if (!root || !window.Plotly) return;
  const charts = [];
  const WEBGL_FROM_RUNS = 50;
  // Plotly's default colourway, which one trace per run would cycle through.
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  let smoothing = 0, logScale = false;
  const box = document.getElementById("dash-charts");
  // Times are milliseconds since the navigation started (performance.now()'s origin).
  window.compareState = { charts, renderedMs: null, startedMs: performance.now() };

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
    await new Promise(resolve => requestAnimationFrame(() => resolve()));  // drawn means painted: a frame after it
    chart.drawnMs = performance.now();
  }

  function draw(chart) {
    const runs = chart.runs.filter(r => r.x.length);
    const layout = Dash.layout(chart.key, logScale);
    layout.showlegend = runs.length <= 12;
    const traces = runs.length > WEBGL_FROM_RUNS ? groupedTraces(runs) : runs.map(r => ({
      type: "scatter", x: Array.from(r.x), y: Array.from(Dash.smooth(r.y, smoothing), finiteOrNull), name: label(r),
      mode: Dash.mode(r.x.length), line: { width: 1 },
    }));
    chart.runsDrawn = runs.length;
    chart.builtMs = performance.now();
    chart.div.dataset.traces = traces.length;
    chart.div.dataset.runs = runs.length;
    return Plotly.react(chart.div, traces, layout, Dash.config);
  }

  // A fork drawn from its parent's step (the server moved its steps: views.fork_offsets) says so in its name.
  function label(run) { return "#" + run.id + " " + run.name + (run.offset ? " (from step " + run.offset + ")" : ""); }

  // Past a few dozen runs: WebGL, and one trace per colour of the palette holding every run of that
  // colour, each run's line ended by a gap (null). Plotly pays per trace (a thousand WebGL traces took
  // seconds to draw); the colours are those one trace per run gets (run i: colour i mod palette), and
  // hovering a point still names its run. SVG below that: one path element per run and chart, which
  // draws faster than WebGL on machines without a GPU and keeps a legend of names.
  // A run's series are typed arrays (the packed response): NaN, a value that was not finite, is null here.
  function finiteOrNull(value) { return Number.isFinite(value) ? value : null; }

  function groupedTraces(runs) {
    const sizes = PALETTE.map(() => 0);
    runs.forEach((r, i) => { sizes[i % sizes.length] += r.x.length + 1; });
    const groups = sizes.map(size => ({ x: new Array(size), y: new Array(size), text: new Array(size), at: 0 }));
    runs.forEach((r, i) => {
      const group = groups[i % groups.length], y = Dash.smooth(r.y, smoothing), name = label(r);
      let at = group.at;
      for (let j = 0; j < r.x.length; j++, at++) { group.x[at] = r.x[j]; group.y[at] = finiteOrNull(y[j]); group.text[at] = name; }
      group.x[at] = null; group.y[at] = null; group.text[at] = name;
      group.at = at + 1;
    });
    return groups.filter(g => g.x.length).map((g, i) => ({
      type: "scattergl", x: g.x, y: g.y, text: g.text, mode: "lines", line: { width: 1, color: PALETTE[i] },
      hovertemplate: "%{text}<br>step %{x}: %{y}<extra></extra>", showlegend: false, connectgaps: false,
    }));
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
