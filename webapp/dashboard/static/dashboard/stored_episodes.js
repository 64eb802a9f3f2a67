// The run page's episode store: every stored episode (the API's filters as a form, a page at a time),
// one step's reward histogram whose bars open their episodes, a group's episodes side by side, one
// dataset row's prompt across training. The page's address carries the filter (the API's parameter
// names), so a link with ?step_min=..&termination=.. opens the list filtered. Every text here is the
// run's (untrusted): set with textContent only.
(function () {
  const box = document.getElementById("stored-episodes");
  if (!box) return;
  const form = document.getElementById("stored-episodes-filter");
  const body = document.querySelector("#stored-episodes-list tbody");
  const note = document.getElementById("stored-episodes-note");
  const more = document.getElementById("stored-episodes-more");
  const FILTERS = ["split", "step_min", "step_max", "reward_min", "reward_max", "termination", "data_source", "group",
                   "row_index", "drift", "q"];
  // data-url may carry a query already (a share link's token).
  const withQuery = (url, query) => query ? url + (url.includes("?") ? "&" : "?") + query : url;
  const query = extra => {
    const params = new URLSearchParams();
    for (const [name, value] of new FormData(form)) if (value !== "") params.set(name, value);
    for (const [name, value] of Object.entries(extra || {})) params.set(name, value);
    return params.toString();
  };
  const show = value => value === null || value === undefined || value === "" ? "—" :
    typeof value === "number" && !Number.isInteger(value) ? value.toFixed(3) : String(value);
  const el = (tag, className, text) => {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const pageOf = id => box.dataset.pageUrl + Number(id) + "/" + box.dataset.shareQuery;
  const detailUrl = id => { const [path, search] = box.dataset.url.split("?"); return path + Number(id) + "/" + (search ? "?" + search : ""); };
  const driftText = e => e.retokenization_drift === true ? "drifts at " + e.drift_position :
    e.retokenization_drift === false ? "renders back" : "—";
  const mean = values => values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
  const errorText = data => Object.entries(data).map(([name, errors]) => name + ": " + [].concat(errors).join(" ")).join("; ");

  async function getJson(url) {
    const response = await fetch(url, { credentials: "same-origin" });
    return { ok: response.ok, data: await response.json() };
  }

  // -- the list ------------------------------------------------------------------------------------

  function link(text, onClick) {
    const a = el("a", "", text);
    a.href = "#";
    a.addEventListener("click", ev => { ev.preventDefault(); onClick(); });
    return a;
  }

  async function load(url, append) {
    const { ok, data } = await getJson(url);
    if (!ok) { note.textContent = errorText(data); return; }
    if (!append) body.innerHTML = "";
    for (const e of data.results) {
      const tr = document.createElement("tr");
      // Each episode opens its token view, a page of its own (shareable, with a share link's token).
      const href = pageOf(e.id);
      const cells = [e.id, e.split, e.step, e.group.slice(0, 8), e.reward, e.termination_reason, e.data_source,
                     e.row_index, e.advantage, driftText(e)];
      cells.forEach((v, i) => {
        const td = document.createElement("td");
        if (i === 0) { const a = el("a", "", show(v)); a.href = href; td.appendChild(a); }
        else if (i === 3 && e.group) {
          const a = link(show(v), () => applyFilter({ group: e.group, split: e.split }));
          a.className = "open-group"; a.title = "This group's episodes side by side"; td.appendChild(a);
        } else if (i === 7 && v !== null) {
          const a = link(show(v), () => applyFilter({ row_index: e.row_index, split: e.split }));
          a.className = "open-row"; a.title = "This dataset row's episodes at each step"; td.appendChild(a);
        } else if (i === 9 && e.retokenization_drift) td.appendChild(el("span", "drift-flag", v));
        else td.textContent = show(v);
        tr.appendChild(td);
      });
      tr.addEventListener("click", ev => { if (!ev.target.closest("a")) window.location.href = href; });
      body.appendChild(tr);
    }
    note.textContent = body.children.length ? body.children.length + " shown" + (data.next ? ", more match" : "") : "No episode matches.";
    more.hidden = !data.next;
    more.onclick = () => load(data.next, true);
  }

  function refresh() {
    document.getElementById("stored-episodes-parquet").href = withQuery(box.dataset.url, query({ format: "parquet" }));
    document.getElementById("stored-episodes-jsonl").href = withQuery(box.dataset.url, query({ format: "jsonl" }));
    load(withQuery(box.dataset.url, query()), false);
    const values = Object.fromEntries(new FormData(form));
    showGroup(values.group, values.split);
    showPrompt(values.row_index, values.split);
  }

  // The filter into the page's address (other parameters, a share link's token, kept), and back.
  function toAddress(push) {
    const params = new URLSearchParams(window.location.search);
    for (const name of FILTERS) params.delete(name);
    for (const [name, value] of new URLSearchParams(query())) params.set(name, value);
    const search = params.toString();
    const url = window.location.pathname + (search ? "?" + search : "") + "#stored-episodes-heading";
    if (url !== window.location.pathname + window.location.search + window.location.hash) {
      window.history[push ? "pushState" : "replaceState"](null, "", url);
    }
  }

  function fromAddress() {
    const params = new URLSearchParams(window.location.search);
    for (const name of FILTERS) {
      const field = form.elements[name];
      if (field) field.value = params.get(name) || "";
    }
    return FILTERS.some(name => params.get(name));
  }

  // Opens exactly ``filter`` (every other field cleared), as a new entry of the browser's history.
  function applyFilter(filter) {
    for (const name of FILTERS) form.elements[name].value = filter[name] !== undefined && filter[name] !== null ? String(filter[name]) : "";
    toAddress(true);
    refresh();
    document.getElementById("stored-episodes-heading").scrollIntoView();
  }
  window.openStoredEpisodes = applyFilter;  // the run page's charts open a step's episodes with it

  form.addEventListener("submit", ev => { ev.preventDefault(); toAddress(true); refresh(); });
  document.getElementById("stored-episodes-clear").addEventListener("click", () => applyFilter({}));
  window.addEventListener("popstate", () => { fromAddress(); refresh(); });

  // -- one step's reward histogram -----------------------------------------------------------------

  const histogramForm = document.getElementById("episode-histogram-form");
  const histogramNote = document.getElementById("episode-histogram-note");
  const histogramChart = document.getElementById("episode-histogram-chart");
  const histogramBins = document.getElementById("episode-histogram-bins");
  let histogram = null;

  function openBin(bin) {
    if (!bin.count) return;
    applyFilter({ split: histogram.split, step_min: histogram.step, step_max: histogram.step,
                  reward_min: bin.reward_min, reward_max: bin.reward_max });
  }

  async function loadHistogram() {
    const fields = Object.fromEntries(new FormData(histogramForm));
    const params = new URLSearchParams({ split: fields.split });
    if (fields.step !== "") params.set("step", fields.step);
    const { ok, data } = await getJson(withQuery(box.dataset.histogramUrl, params.toString()));
    histogramBins.innerHTML = "";
    if (!ok) { histogramNote.textContent = errorText(data); return; }
    histogram = data;
    if (data.step === null) { histogramNote.textContent = "No " + data.split + " episodes stored yet."; histogramChart.hidden = true; return; }
    histogramForm.elements.step.placeholder = String(data.last_step);
    document.getElementById("episode-histogram-title").textContent = "Rewards of step " + data.step + " (" + data.split + ")";
    histogramNote.textContent = data.count + " episodes" + (data.no_reward ? ", " + data.no_reward + " without a reward" : "") +
      (data.first_step !== null ? " · steps " + data.first_step + "–" + data.last_step + " stored" : "") +
      (data.count ? " · click a bar to open its episodes" : "");
    histogramChart.hidden = !data.bins.length;
    if (!data.bins.length || !window.Plotly) return;
    const width = data.bins.map(b => b.high - b.low);
    const trace = {
      type: "bar", x: data.bins.map(b => (b.low + b.high) / 2), y: data.bins.map(b => b.count),
      width: width.map(w => w > 0 ? w * 0.95 : 0.5), customdata: data.bins.map(b => [b.low, b.high]),
      hovertemplate: "reward %{customdata[0]:.3f} – %{customdata[1]:.3f}<br>%{y} episodes<extra></extra>",
      marker: { color: "#2f5fd0" },
    };
    const layout = Dash.layout("", false);
    layout.xaxis.title.text = "reward"; layout.yaxis.title = { text: "episodes" }; layout.margin.t = 10;
    Plotly.react(histogramChart, [trace], layout, Dash.config);
    if (!histogramChart.dataset.clicks) {
      histogramChart.dataset.clicks = "1";
      histogramChart.on("plotly_click", ev => { const p = ev.points && ev.points[0]; if (p) openBin(histogram.bins[p.pointIndex]); });
    }
    // The bars as links too (keyboard, screen readers): each opens the same episodes.
    data.bins.forEach(bin => {
      if (!bin.count) return;
      const item = el("li");
      item.appendChild(link(bin.low.toFixed(3) + " – " + bin.high.toFixed(3) + ": " + bin.count, () => openBin(bin)));
      histogramBins.appendChild(item);
    });
  }
  histogramForm.addEventListener("submit", ev => { ev.preventDefault(); loadHistogram(); });

  // -- a group side by side ------------------------------------------------------------------------

  const lastReply = detail => {
    const turns = detail.turns || [];
    return turns.length ? String(turns[turns.length - 1].response ?? "") : "";
  };

  async function showGroup(group, split) {
    const section = document.getElementById("episode-group");
    const cards = document.getElementById("episode-group-cards");
    section.hidden = !group;
    cards.innerHTML = "";
    if (!group) return;
    const params = new URLSearchParams({ group, limit: "500" });
    if (split) params.set("split", split);
    const { ok, data } = await getJson(withQuery(box.dataset.url, params.toString()));
    if (!ok) { document.getElementById("episode-group-summary").textContent = errorText(data); return; }
    const episodes = data.results;
    const rewards = episodes.map(e => e.reward).filter(r => typeof r === "number");
    const average = mean(rewards);
    const spread = rewards.length ? Math.sqrt(mean(rewards.map(r => (r - average) ** 2))) : null;
    const first = episodes[0];
    document.getElementById("episode-group-title").textContent = "Group " + group + (first ? " · step " + first.step : "");
    document.getElementById("episode-group-summary").textContent = episodes.length + " episodes of one prompt · mean reward " +
      show(average) + " · std " + show(spread) + (rewards.length > 1 && spread === 0 ? " · every reward equal: no advantage to learn from" : "");
    const best = Math.max(...rewards), worst = Math.min(...rewards);
    const cardOf = new Map();
    for (const e of episodes) {
      const card = el("article", "episode-card" + (rewards.length > 1 && best !== worst ? (e.reward === best ? " best" : e.reward === worst ? " worst" : "") : ""));
      const title = el("h4");
      const a = el("a", "", "#" + e.group_position + " · episode " + e.id); a.href = pageOf(e.id); title.appendChild(a);
      card.appendChild(title);
      const facts = el("dl");
      for (const [name, value] of [["Reward", show(e.reward)], ["Advantage", show(e.advantage)],
                                   ["Termination", show(e.termination_reason)], ["Response tokens", show(e.response_length)],
                                   ["Retokenization", driftText(e)]]) {
        facts.appendChild(el("dt", "", name)); facts.appendChild(el("dd", "", value));
      }
      card.appendChild(facts);
      card.appendChild(el("pre", "episode-reply", "…"));
      cards.appendChild(card);
      cardOf.set(e.id, card);
    }
    // Each card's last reply, read from the episode's body (a group's episodes lie in one file).
    await Promise.all(episodes.slice(0, 64).map(async e => {
      const detail = await getJson(detailUrl(e.id));
      cardOf.get(e.id).querySelector(".episode-reply").textContent = detail.ok ? (lastReply(detail.data) || "(no reply)") : "could not be read";
    }));
  }

  // -- one prompt across training ------------------------------------------------------------------

  async function showPrompt(row, split) {
    const section = document.getElementById("episode-prompt");
    const steps = document.querySelector("#episode-prompt-steps tbody");
    section.hidden = row === undefined || row === "";
    steps.innerHTML = "";
    if (section.hidden) return;
    const params = new URLSearchParams({ row_index: row, limit: "500" });
    if (split) params.set("split", split);
    const { ok, data } = await getJson(withQuery(box.dataset.url, params.toString()));
    const text = document.getElementById("episode-prompt-text");
    if (!ok) { text.textContent = errorText(data); return; }
    const episodes = data.results;
    document.getElementById("episode-prompt-title").textContent = "Dataset row " + row + " across training: " +
      episodes.length + " episodes" + (data.next ? " (the first 500)" : "");
    const byStep = new Map();
    for (const e of episodes) {
      const key = e.split + " " + e.step;
      if (!byStep.has(key)) byStep.set(key, []);
      byStep.get(key).push(e);
    }
    for (const [, group] of byStep) {
      const tr = document.createElement("tr");
      const rewards = group.map(e => e.reward).filter(r => typeof r === "number");
      tr.appendChild(el("td", "", group[0].step + (group[0].split === "val" ? " (val)" : "")));
      tr.appendChild(el("td", "", String(group.length)));
      tr.appendChild(el("td", "", show(mean(rewards))));
      const cell = el("td");
      group.forEach((e, i) => {
        if (i) cell.appendChild(document.createTextNode(" "));
        const a = el("a", "", show(e.reward)); a.href = pageOf(e.id); a.title = "episode " + e.id; cell.appendChild(a);
      });
      tr.appendChild(cell);
      steps.appendChild(tr);
    }
    if (window.Plotly && episodes.length) {
      const chart = document.getElementById("episode-prompt-chart");
      const layout = Dash.layout("Reward of row " + row + " at each step it was sampled", false);
      Plotly.react(chart, [{ type: "scatter", mode: "markers", x: episodes.map(e => e.step), y: episodes.map(e => e.reward),
                             customdata: episodes.map(e => e.id), hovertemplate: "step %{x}: reward %{y}<extra></extra>" }],
                   layout, Dash.config);
      if (!chart.dataset.clicks) {
        chart.dataset.clicks = "1";
        chart.on("plotly_click", ev => { const p = ev.points && ev.points[0]; if (p) window.location.href = pageOf(p.customdata); });
      }
    }
    // The prompt itself, from the first episode's body.
    text.textContent = "";
    if (episodes.length) {
      const detail = await getJson(detailUrl(episodes[0].id));
      const prompt = detail.ok ? detail.data.prompt : null;
      text.textContent = typeof prompt === "string" ? prompt :
        Array.isArray(prompt) ? prompt.map(m => (m && m.role ? m.role + ": " : "") + (m && typeof m.content === "string" ? m.content : JSON.stringify(m))).join("\n") : "";
    }
  }

  fromAddress();
  refresh();
  loadHistogram();
})();
