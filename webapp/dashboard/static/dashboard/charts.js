// Shared by the run page and the compare page: smoothing, chart layout, log scale.
window.Dash = (function () {
  // TensorBoard's debiased exponential moving average; nulls pass through.
  function smooth(ys, weight) {
    if (!weight) return ys;
    const out = new Array(ys.length);
    let last = 0, debias = 0;
    for (let i = 0; i < ys.length; i++) {
      const y = ys[i];
      if (y === null || !isFinite(y)) { out[i] = null; continue; }
      last = last * weight + (1 - weight) * y;
      debias = debias * weight + (1 - weight);
      out[i] = last / debias;
    }
    return out;
  }
  // The title sits at the chart's left edge and the modebar (shown while the pointer is over the
  // chart) at its right, with only the buttons a line chart needs: centred, a long title ran under
  // the nine default buttons. uirevision: Plotly keeps a person's zoom and pan across redraws, and
  // autoscales to the data until they zoom (a double-click autoscales again).
  function layout(title, logScale) {
    return {
      title: { text: title, font: { size: 13 }, x: 0, xref: "container", xanchor: "left", pad: { l: 8 } },
      margin: { l: 50, r: 10, t: 30, b: 30 },
      xaxis: { title: { text: "step" } }, yaxis: { type: logScale ? "log" : "linear" },
      showlegend: false, hovermode: "closest", uirevision: title,
    };
  }
  const config = {
    responsive: true, displaylogo: false, displayModeBar: "hover",
    modeBarButtonsToRemove: ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d"],
  };
  // One point draws no line: it gets a marker.
  function mode(points, markers) { return markers || points === 1 ? "lines+markers" : "lines"; }
  return { smooth, layout, config, mode };
})();
