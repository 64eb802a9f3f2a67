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
  function layout(title, logScale) {
    return {
      title: { text: title, font: { size: 13 } }, margin: { l: 50, r: 10, t: 30, b: 30 },
      xaxis: { title: { text: "step" } }, yaxis: { type: logScale ? "log" : "linear" },
      showlegend: false, hovermode: "closest", uirevision: title,
    };
  }
  const config = { responsive: true, displaylogo: false };
  return { smooth, layout, config };
})();
