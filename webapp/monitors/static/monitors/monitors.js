// The run page's reward-health section: each monitor's latest value, the alerts of the project's
// rules, and an alert's evidence (the episodes of its step beside the same prompts' earlier ones).
(function () {
  const root = document.getElementById("run-monitors");
  if (!root) return;
  const share = root.dataset.shareQuery || "";
  const withQuery = (url, query) => url + (url.includes("?") ? "&" : "?") + query;
  const api = query => share ? withQuery(root.dataset.url + share, query) : root.dataset.url + (query ? "?" + query : "");

  function el(parent, tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = text;
    if (className) node.className = className;
    if (parent) parent.appendChild(node);
    return node;
  }
  const fmt = v => v === null || v === undefined ? "—" : Number(v).toPrecision(3);

  async function load() {
    const r = await fetch(api(""));
    if (!r.ok) { root.querySelector("#monitors-note").textContent = "The monitors could not be read (" + r.status + ")."; return; }
    const body = await r.json();
    const rows = root.querySelector("#monitors-table tbody");
    rows.textContent = "";
    for (const m of body.monitors) {
      const tr = el(rows, "tr");
      tr.dataset.monitor = m.monitor;
      el(tr, "td", m.label);
      el(tr, "td", m.source ? fmt(m.latest) : "not reported", m.source ? "" : "muted");
      el(tr, "td", m.what + (m.source ? " (" + m.source + ", window " + m.window + ")" : ""), "muted");
    }
    root.querySelector("#monitors-note").textContent = "Steps " + body.step_min + "–" + body.step_max + ". " +
      (body.rules.length ? body.rules.length + " rule(s) of the project on, " +
        body.rules.filter(r => r.delivered).length + " also delivered to an alert target (the others are shown here only)."
        : "The project has no monitor rule on.");
    const alerts = root.querySelector("#monitor-alerts");
    alerts.textContent = "";
    if (!body.alerts.length) el(alerts, "li", body.rules.length ? "No rule fired." : "No alerts: no rule is on.", "muted");
    for (const a of body.alerts) {
      const li = el(alerts, "li", null, "monitor-alert");
      li.dataset.step = a.step;
      el(li, "strong", a.label);
      el(li, "span", " above " + a.threshold + " at step " + a.step + " (" + fmt(a.value) + ", window " + a.window + ") ");
      const open = el(li, "button", "Evidence");
      open.type = "button";
      open.addEventListener("click", () => showEvidence(a));
    }
  }

  async function showEvidence(alert) {
    const box = root.querySelector("#monitor-evidence");
    box.hidden = false;
    box.textContent = "";
    el(box, "h3", "Evidence: " + alert.label + " at step " + alert.step);
    const r = await fetch(withQuery(root.dataset.evidenceUrl + share, "step=" + alert.step + "&window=" + alert.window));
    if (!r.ok) { el(box, "p", "The evidence could not be read (" + r.status + ").", "muted"); return; }
    const body = await r.json();
    if (!body.prompts.length) { el(box, "p", "No training episode of step " + alert.step + " is stored.", "muted"); return; }
    el(box, "p", "The training episodes of step " + alert.step + ", each prompt beside its episodes of an earlier step.", "muted");
    const table = el(box, "table", null, "monitor-evidence-table");
    const head = el(el(table, "thead"), "tr");
    ["Prompt", "Step " + alert.step, "Earlier"].forEach(t => el(head, "th", t));
    const rows = el(table, "tbody");
    for (const p of body.prompts) {
      const tr = el(rows, "tr");
      el(tr, "td", p.prompt);
      episodes(el(tr, "td", null, "evidence-now"), p.episodes);
      const earlier = el(tr, "td", null, "evidence-earlier");
      if (p.earlier_step === null) el(earlier, "span", "not trained before", "muted");
      else { el(earlier, "div", "step " + p.earlier_step, "muted"); episodes(earlier, p.earlier); }
    }
    box.scrollIntoView({ block: "nearest" });
  }

  function episodes(cell, list) {
    for (const e of list) {
      const a = el(cell, "a", "reward " + fmt(e.reward) + " · " + e.response_length + " tok · " + (e.termination_reason || "?"));
      a.href = root.dataset.episodePage + e.id + "/" + share;
      a.className = "evidence-episode";
      el(cell, "br");
    }
  }

  load();
})();
