// The run page: charts fed by a downsampled fetch, then live points over the run's websocket.
(function () {
  const root = document.getElementById("run-dashboard");
  if (!root || !window.Plotly) return;
  const CHARTS = [
    ["reward", "Reward"], ["reward_std", "Reward std"], ["loss", "Loss"], ["kl", "KL"], ["entropy", "Entropy"],
    ["response_length", "Response length"], ["turns", "Turns per episode"], ["termination/", "Termination reasons"],
    ["step_time", "Step time (s)"], ["val/", "Validation (test set)"],
    // System metrics, sampled in the training process (training/tracking/system_metrics.py): one chart per unit.
    ["system/cpu/", "System: CPU (%)"], ["system/memory_gb/", "System: memory (GB)"],
    ["system/gpu_utilization/", "System: GPU utilisation (%)"], ["system/gpu_memory_gb/", "System: GPU memory (GB)"],
    ["system/gpu_power_watts/", "System: GPU power (W)"],
  ];
  const LIVE_POINTS_BEFORE_REFETCH = 4000;
  const MAX_KEYS_PER_REQUEST = 40;  // series.json's limit
  const FINAL = ["succeeded", "failed", "cancelled", "pruned"];
  const state = {
    series: new Map(),   // key -> {x: [], y: []} (downsampled history + live points)
    charts: [],          // {id, title, match(key), div, zoom: null | {x0, x1, data: Map}}
    keys: [],
    lastStep: -1,
    lastLogId: parseInt(root.dataset.lastLogId || "0", 10),
    status: root.dataset.status,
    smoothing: 0,
    logScale: false,
    attempts: [],        // the ledger's attempts: each one's start and end marked on every chart
  };
  // Live metric messages are numbered per run (seq). A number skipped means the channel layer lost
  // a message: the steps it carried are read back from the store (series.json?after=).
  const gaps = {
    seq: null,       // the number of the last metrics message, from the socket's opening status on
    complete: -1,    // every point through this step is here: a backfill reads what lies after it
    through: -1,     // the highest step seen live when a gap showed: the store must reach it
    seen: 0,         // gaps seen so far (one that shows while a backfill runs makes it read again)
    running: false,
  };
  state.gaps = gaps;
  window.dashboardState = state;  // for the browser tests and benchmarks
  // The data-*-url attributes may carry a query already (a share link's token).
  const withQuery = (url, query) => query ? url + (url.includes("?") ? "&" : "?") + query : url;
  const chartsBox = document.getElementById("dash-charts");

  function addChart(id, title, match) {
    if (state.charts.some(c => c.id === id)) return;
    const empty = document.getElementById("dash-empty");
    if (empty) empty.remove();
    const div = document.createElement("div");
    div.className = "dash-chart";
    div.id = "chart-" + id.replace(/[^A-Za-z0-9_-]/g, "_");
    div.dataset.key = id;
    const chart = { id, title, match, div, zoom: null, points: 0, revision: 0 };
    const next = state.charts.findIndex(c => comesBefore(chart, c));
    if (next < 0) { chartsBox.appendChild(div); state.charts.push(chart); }
    else { chartsBox.insertBefore(div, state.charts[next].div); state.charts.splice(next, 0, chart); }
    Plotly.newPlot(div, [], Dash.layout(title, state.logScale), Dash.config);
    div.on("plotly_relayout", ev => onZoom(chart, ev));
    // A point opens its step's episodes in the episode store's list below (validation's: the val split),
    // unless the click was the first of a double-click (which gives the chart back its whole range).
    let opening = null;
    div.on("plotly_click", ev => {
      const point = ev.points && ev.points[0];
      if (!point || !window.openStoredEpisodes || !Number.isFinite(point.x)) return;
      const step = Math.round(point.x);
      const split = String(point.data.name || "").startsWith("val/") ? "val" : "train";
      clearTimeout(opening);
      opening = setTimeout(() => window.openStoredEpisodes({ split, step_min: step, step_max: step }), 400);
    });
    div.on("plotly_doubleclick", () => { clearTimeout(opening); });
    draw(chart);
  }

  // Charts stand in one order whatever order their keys arrive in: the known ones as CHARTS lists
  // them, then those a person added from the search box, by name.
  function comesBefore(a, b) {
    const rank = chart => { const i = CHARTS.findIndex(([id]) => id === chart.id); return i < 0 ? CHARTS.length : i; };
    return rank(a) < rank(b) || (rank(a) === rank(b) && a.id < b.id);
  }

  function chartFor(key) {
    for (const [id, title] of CHARTS) {
      if (id.endsWith("/") ? key.startsWith(id) : key === id) return { id, title };
    }
    return null;
  }

  function keysOf(chart) { return [...state.series.keys()].filter(chart.match).sort(); }

  function draw(chart) {
    const source = chart.zoom ? chart.zoom.data : state.series;
    const traces = [];
    let points = 0;
    for (const key of [...source.keys()].filter(chart.match).sort()) {
      const s = source.get(key);
      points += s.x.length;
      if (state.smoothing > 0) {
        traces.push({ x: s.x, y: s.y, name: key + " (raw)", mode: "lines", line: { width: 1 }, opacity: 0.25, hoverinfo: "skip" });
      }
      // Validation is scored every few steps: markers show each score.
      const mode = Dash.mode(s.x.length, key.startsWith("val/"));
      traces.push({ x: s.x, y: Dash.smooth(s.y, state.smoothing), name: key, mode, line: { width: 1.5 } });
    }
    chart.points = points;
    const layout = Dash.layout(chart.title, state.logScale);
    layout.showlegend = traces.length > 2 || (traces.length > 1 && state.smoothing === 0);
    if (chart.zoom) layout.xaxis.range = [chart.zoom.x0, chart.zoom.x1];
    Object.assign(layout, attemptMarks());
    // Live points are pushed onto the same arrays, which Plotly takes for unchanged data: a new
    // revision makes it read them again (and autoscale, unless a person zoomed).
    layout.datarevision = ++chart.revision;
    Plotly.react(chart.div, traces, layout, Dash.config);
    chart.div.dataset.points = points;
  }

  // Each attempt's start (a dashed line at the last step stored when it began, labelled with its
  // number) and, once it ended otherwise than by finishing the run, its end and cause (a dotted
  // line at the last step stored then): where a resumed run picked up, and why.
  const CAUSES = { succeeded: "succeeded", failed: "failed", lost: "lost worker", requeued: "re-queued",
                   superseded: "superseded", cancelled: "cancelled" };
  function attemptMarks() {
    const shapes = [], annotations = [];
    for (const a of state.attempts) {
      if (a.start_step === null || a.start_step === undefined) continue;
      const line = (x, dash) => ({ type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
                                   line: { dash, width: 1, color: "#8a5a00" } });
      shapes.push(line(a.start_step, "dash"));
      annotations.push({ x: a.start_step, xref: "x", y: 1, yref: "paper", yanchor: "bottom", xanchor: "left",
                         showarrow: false, font: { size: 10, color: "#8a5a00" }, text: "attempt " + a.attempt,
                         hovertext: "attempt " + a.attempt + (a.worker ? " on " + a.worker : "") + " began after step " + a.start_step });
      if (a.cause && a.cause !== "succeeded" && a.end_step !== null && a.end_step !== undefined) {
        shapes.push(line(a.end_step, "dot"));
        annotations.push({ x: a.end_step, xref: "x", y: 0.92, yref: "paper", yanchor: "top", xanchor: "right",
                           showarrow: false, font: { size: 10, color: "#a11" }, bgcolor: "rgba(255,255,255,0.8)",
                           text: "attempt " + a.attempt + ": " + (CAUSES[a.cause] || a.cause),
                           hovertext: a.detail || CAUSES[a.cause] || a.cause });
      }
    }
    return { shapes, annotations };
  }

  // Read again when the run's status changes (a claim starts an attempt, a re-queue or end closes one).
  async function loadAttempts() {
    if (!root.dataset.ledgerUrl) return;
    try {
      const r = await fetch(withQuery(root.dataset.ledgerUrl, "step_min=" + 2147483647));
      if (!r.ok) return;
      state.attempts = (await r.json()).attempts || [];
      state.charts.forEach(draw);
    } catch (e) { /* the marks wait for the next status change */ }
  }

  let redrawPending = false;
  function scheduleRedraw() {
    if (redrawPending) return;
    redrawPending = true;
    setTimeout(() => { redrawPending = false; state.charts.forEach(c => { if (!c.zoom) draw(c); }); }, 150);
  }

  // Zoom asks the server for a finer view of the range; a double-click (autorange) goes back.
  async function onZoom(chart, ev) {
    if (ev["xaxis.autorange"] && chart.zoom) { chart.zoom = null; draw(chart); return; }
    const x0 = ev["xaxis.range[0]"], x1 = ev["xaxis.range[1]"];
    if (x0 === undefined || x1 === undefined) return;
    const keys = keysOf(chart);
    if (!keys.length) return;
    const url = withQuery(root.dataset.seriesUrl, "keys=" + encodeURIComponent(keys.join(",")) +
      "&start=" + Math.floor(x0) + "&end=" + Math.ceil(x1));
    const data = await (await fetch(url)).json();
    const zoomed = new Map();
    for (const [key, s] of Object.entries(data.series)) zoomed.set(key, { x: s.x, y: s.y });
    chart.zoom = { x0, x1, data: zoomed };
    draw(chart);
  }

  async function loadSeries(keys) {
    const url = withQuery(root.dataset.seriesUrl, keys ? "keys=" + encodeURIComponent(keys.join(",")) : "");
    const data = await (await fetch(url)).json();
    for (const [key, s] of Object.entries(data.series)) {
      const fresh = { x: s.x, y: s.y, live: 0 };
      // Points that arrived live while this read ran, past the last one it holds, stay.
      const old = state.series.get(key);
      if (old) old.x.forEach((step, i) => { if (step > s.last_step) { fresh.x.push(step); fresh.y.push(old.y[i]); fresh.live++; } });
      state.series.set(key, fresh);
      state.lastStep = Math.max(state.lastStep, s.last_step);
    }
    state.lastStep = Math.max(state.lastStep, data.last_step);
    setKeys(data.keys);
    return data;
  }

  function setKeys(keys) {
    state.keys = keys;
    const list = document.getElementById("dash-keys");
    list.innerHTML = "";
    for (const key of keys) { const o = document.createElement("option"); o.value = key; list.appendChild(o); }
  }

  function addPoints(points) {
    const fresh = [];
    for (const [key, pairs] of Object.entries(points)) {
      let s = state.series.get(key);
      if (!s) {
        if (!state.keys.includes(key)) { state.keys.push(key); setKeys(state.keys.sort()); }
        if (!chartFor(key) && !state.charts.some(c => c.match(key))) continue;
        s = { x: [], y: [], live: 0 };
        state.series.set(key, s);
        fresh.push(key);
      }
      s.live += merge(s, pairs);
      for (const [step] of pairs) state.lastStep = Math.max(state.lastStep, step);
      if (s.live > LIVE_POINTS_BEFORE_REFETCH) { s.live = 0; loadSeries([key]).then(scheduleRedraw); }
    }
    for (const key of fresh) {
      const c = chartFor(key);
      if (c) addChart(c.id, c.title, c.id.endsWith("/") ? (k => k.startsWith(c.id)) : (k => k === c.id));
    }
    showProgress(state.lastStep);
    scheduleRedraw();
  }

  // Merge [step, value] pairs (in step order) into series s, keeping it in step order with each step
  // once (a step it has already takes the value that came now). Returns how many steps it gained.
  function merge(s, pairs) {
    if (!pairs.length) return 0;
    if (!pairs.every((p, i) => i === 0 || p[0] > pairs[i - 1][0])) {  // a replayed step in one message
      const byStep = new Map(pairs.map(p => [p[0], p]));  // the later value of a step wins
      pairs = [...byStep.values()].sort((a, b) => a[0] - b[0]);
    }
    const last = s.x.length ? s.x[s.x.length - 1] : -Infinity;
    if (pairs[0][0] > last) {  // the live case: everything is new and comes after
      for (const [step, value] of pairs) { s.x.push(step); s.y.push(value); }
      return pairs.length;
    }
    const x = [], y = [];
    let i = 0, j = 0;
    while (i < s.x.length || j < pairs.length) {
      if (j === pairs.length || (i < s.x.length && s.x[i] < pairs[j][0])) { x.push(s.x[i]); y.push(s.y[i]); i++; continue; }
      if (i < s.x.length && s.x[i] === pairs[j][0]) i++;
      x.push(pairs[j][0]); y.push(pairs[j][1]); j++;
    }
    const gained = x.length - s.x.length;
    s.x = x; s.y = y;
    return gained;
  }

  // -- gaps in the live stream ---------------------------------------------------------------------
  function countMessage(seq) {
    const expected = gaps.seq === null ? seq : gaps.seq + 1;
    gaps.seq = seq;
    if (seq === expected) {
      if (!gaps.running) gaps.complete = state.lastStep;
      return;
    }
    backfill();
  }

  // The socket opened: a reconnect whose opening number moved on from the last message here may
  // have missed messages in between, as a gap would.
  function opened(seq) {
    if (gaps.seq !== null && seq !== gaps.seq) backfill();
    gaps.seq = seq;
  }

  function backfill() {
    gaps.seen++;
    gaps.through = Math.max(gaps.through, state.lastStep);
    if (!gaps.running) { gaps.running = true; runBackfill(); }
  }

  // The worker stores what it logs every 0.5 s, after publishing it: the first read waits for that,
  // and a read that finds the store short of the steps seen live is made again, a little later.
  const BACKFILL_DELAYS_MS = [700, 1000, 2000, 3000, 5000, 8000];
  const gapNotice = document.getElementById("dash-gap-notice");  // shown only when a backfill gives up
  const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
  async function runBackfill() {
    for (let tries = 0; tries < BACKFILL_DELAYS_MS.length; tries++) {
      await sleep(BACKFILL_DELAYS_MS[tries]);
      const seen = gaps.seen, through = gaps.through;
      let data = null;
      try {
        const response = await fetch(withQuery(root.dataset.seriesUrl, "after=" + gaps.complete));
        if (response.ok) data = await response.json();
      } catch (err) { /* the network: try again */ }
      if (data === null) continue;
      if (data.too_many) await reloadSeries();  // too far behind for raw points: the downsampled view again
      else {
        const points = {};
        for (const [key, s] of Object.entries(data.series)) points[key] = s.x.map((step, i) => [step, s.y[i]]);
        addPoints(points);
      }
      // The writer stores steps in the order they were logged: through the store's last step, nothing is missing.
      gaps.complete = Math.max(gaps.complete, Math.min(data.last_step, through));
      if (data.last_step < through) continue;
      if (gaps.seen !== seen) { tries = -1; continue; }  // another gap meanwhile: read on from here
      gaps.running = false;
      gapNotice.hidden = true;
      return;
    }
    gaps.running = false;
    gapNotice.hidden = false;
  }

  async function reloadSeries() {
    await loadKeys([...state.series.keys()]);
    scheduleRedraw();
  }

  async function loadKeys(keys) {
    for (let i = 0; i < keys.length; i += MAX_KEYS_PER_REQUEST) await loadSeries(keys.slice(i, i + MAX_KEYS_PER_REQUEST));
  }

  // -- the websocket ---------------------------------------------------------------------------
  let socket = null, retry = 500;
  const liveBadge = document.getElementById("dash-live");
  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const url = scheme + location.host + withQuery(root.dataset.wsUrl, "after=" + state.lastStep + "&after_log=" + state.lastLogId);
    socket = new WebSocket(url);
    socket.onopen = () => { retry = 500; showLive(); };
    socket.onmessage = ev => onMessage(JSON.parse(ev.data));
    socket.onclose = ev => {
      liveBadge.classList.remove("on");
      if (ev.code === 4403) { liveBadge.textContent = "○ no longer shared with you"; return; }
      if (FINAL.includes(state.status) && state.finalSeen) { showLive(); return; }
      liveBadge.textContent = "○ reconnecting";
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 5000);
    };
  }

  // "● live" while the run can still change; a finished run says so (its charts are complete).
  // Until the socket is open the badge says so: "live" is a promise that pushes arrive.
  function showLive() {
    const finished = FINAL.includes(state.status);
    const open = socket !== null && socket.readyState === WebSocket.OPEN;
    liveBadge.textContent = finished ? "■ finished (" + state.status + ")" : open ? "● live" : "○ connecting";
    liveBadge.classList.toggle("on", !finished && open);
    liveBadge.classList.toggle("finished", finished);
  }

  // -- progress: step of total, bar, ETA from the pace so far ------------------------------------
  const progress = document.getElementById("run-progress");
  function showProgress(steps) {
    if (!progress) return;
    const counter = document.getElementById("run-steps");
    steps = Math.max(steps || 0, parseInt(counter.textContent || "0", 10));
    counter.textContent = steps;
    const total = parseInt(progress.dataset.total || "0", 10);
    const bar = document.getElementById("run-bar");
    if (total) bar.value = Math.min(steps, total);
    const eta = document.getElementById("run-eta");
    const started = progress.dataset.started ? Date.parse(progress.dataset.started) : NaN;
    if (FINAL.includes(state.status)) { eta.textContent = state.status; if (!total) bar.value = bar.max; return; }
    if (state.status === "queued") { showWaiting(eta); return; }
    if (!total || !steps || isNaN(started)) { eta.textContent = "running"; return; }
    const perStep = (Date.now() - started) / 1000 / steps;
    eta.textContent = "about " + duration(perStep * Math.max(total - steps, 0)) + " left (" + perStep.toFixed(1) + " s per step)";
  }
  // A queued run says what it waits for (its place in the queue, the runs ahead, a queue no worker
  // serves), asked again at each refresh of the progress line while it stays queued.
  async function showWaiting(eta) {
    try {
      const data = await (await fetch(progress.dataset.waitingUrl)).json();
      if (state.status === "queued" && data.waiting) eta.textContent = data.waiting;
    } catch (err) { /* offline for a moment: the next refresh asks again */ }
  }
  function duration(seconds) {
    if (seconds < 90) return Math.round(seconds) + " s";
    if (seconds < 5400) return Math.round(seconds / 60) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  function onMessage(msg) {
    if (msg.type === "metrics") {
      addPoints(msg.points);
      if (msg.seq !== undefined) countMessage(msg.seq);
    } else if (msg.type === "status") {
      if (msg.seq !== undefined) opened(msg.seq);
      if (msg.status !== state.status || msg.attempts !== state.attemptCount) { state.attemptCount = msg.attempts; loadAttempts(); }
      setStatus(msg);
    }
    else if (msg.type === "logs") addLogs(msg.lines);
    else if (msg.type === "episodes") scheduleEpisodes();
    else if (msg.type === "resync") loadSeries(null).then(scheduleRedraw);
  }

  function setStatus(msg) {
    const badge = document.getElementById("run-status");
    const wasFinal = FINAL.includes(state.status);
    state.status = msg.status;
    if (badge) { badge.textContent = msg.status; badge.className = "status status-" + msg.status; }
    if (progress && msg.status === "running" && !progress.dataset.started) progress.dataset.started = msg.started_at || new Date().toISOString();
    // Set when a worker claims the run: a page opened while it was queued shows them without a reload.
    const started = document.getElementById("run-started"), worker = document.getElementById("run-worker");
    if (started && msg.started_at) started.textContent = msg.started_at.slice(0, 19).replace("T", " ");
    if (worker && msg.worker !== undefined) worker.textContent = msg.worker || "\u2014";
    const steps = document.getElementById("run-steps");
    if (progress) showProgress(msg.steps);
    else if (steps && msg.steps !== undefined) steps.textContent = msg.steps;
    showLive();
    if (FINAL.includes(msg.status)) {
      state.finalSeen = true;
      const cancel = document.getElementById("run-cancel");
      if (cancel) cancel.remove();
      // The page shows final metrics, checkpoints and errors: reload once when the run ends.
      if (!wasFinal) setTimeout(() => location.reload(), 1500);
    }
  }

  function addLogs(lines) {
    const log = document.getElementById("run-log");
    if (!log) return;
    if (state.lastLogId === 0 && log.textContent.startsWith("No log")) log.textContent = "";
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 5;
    let text = "";
    for (const line of lines) {
      if (line.id <= state.lastLogId) continue;
      state.lastLogId = line.id;
      text += String(line.time).slice(11, 19) + " " + line.level + " " + line.message + "\n";
    }
    if (text) log.appendChild(document.createTextNode(text));
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  // -- episodes --------------------------------------------------------------------------------
  const stepSelect = document.getElementById("dash-episode-step");
  let episodesTimer = null;
  function scheduleEpisodes() {
    if (episodesTimer) return;
    episodesTimer = setTimeout(() => { episodesTimer = null; loadEpisodes(stepSelect.dataset.pinned ? stepSelect.value : null); }, 1000);
  }
  async function loadEpisodes(step) {
    const url = withQuery(root.dataset.episodesUrl, step !== null && step !== "" ? "step=" + step : "");
    const data = await (await fetch(url)).json();
    document.getElementById("dash-episode-empty").style.display = data.steps.length ? "none" : "";
    stepSelect.innerHTML = "";
    for (const s of data.steps) {
      const o = document.createElement("option"); o.value = s; o.textContent = s; stepSelect.appendChild(o);
    }
    if (data.step !== null) stepSelect.value = data.step;
    const body = document.querySelector("#dash-episode-list tbody");
    body.innerHTML = "";
    data.episodes.forEach(e => {
      const tr = document.createElement("tr");
      tr.className = "dash-episode";
      for (const v of [e.position, fmt(e.reward), e.num_turns, e.termination_reason || "—"]) {
        const td = document.createElement("td"); td.textContent = v; tr.appendChild(td);
      }
      tr.onclick = () => { body.querySelectorAll("tr").forEach(r => r.classList.remove("selected")); tr.classList.add("selected"); showEpisode(e); };
      body.appendChild(tr);
    });
  }
  stepSelect.onchange = () => { stepSelect.dataset.pinned = "1"; loadEpisodes(stepSelect.value); };

  // Each turn: what the model read that is new (the whole prompt, system prompt included, on the
  // first turn of a conversation), what it wrote (trained), and what the environment answered.
  function showEpisode(e) {
    const box = document.getElementById("dash-episode-detail");
    box.innerHTML = "";
    const trained = e.episode.trained_tokens;
    newElement(box, "h3", "Episode " + e.position);
    newElement(box, "p", "Reward " + fmt(e.reward) + " · " + counted(e.num_turns, "turn") + " · ended by " + (e.termination_reason || "—") +
      (trained !== undefined ? " · " + counted(trained, "response token") + " trained" : ""), "dash-episode-facts");
    const trajectories = e.episode.trajectories || [];
    trajectories.forEach(t => {
      if (trajectories.length > 1) newElement(box, "h4", "Trajectory " + (t.name || "") + " · reward " + fmt(t.reward));
      let before = [];  // the conversation through the previous turn's reply
      (t.steps || []).forEach((turn, i) => {
        const div = newElement(box, "section", null, "dash-turn");
        newElement(div, "h4", "Turn " + (i + 1) + " · reward " + fmt(turn.reward) + (turn.done ? " · done" : ""));
        const messages = turn.chat_completions || [];
        const last = messages[messages.length - 1];
        const read = last && last.role === "assistant" ? messages.slice(0, -1) : messages;
        const continues = before.length > 0 && before.length <= read.length && before.every((m, k) => JSON.stringify(m) === JSON.stringify(read[k]));
        if (!continues) turnPart(div, "Prompt (context, not trained)", read.length ? read : "(not recorded)");
        else if (read.length > before.length) turnPart(div, "Added to the conversation (context, not trained)", read.slice(before.length));
        const tokens = turn.response_tokens || 0;
        turnPart(div, "Model response (trained" + (tokens ? ": " + counted(tokens, "token") : "") + ")", turn.model_response, "trained");
        if (turn.next_observation !== undefined && turn.next_observation !== null) {
          turnPart(div, "Environment observation (its reply, not trained)", turn.next_observation);
        }
        before = messages;
      });
    });
  }
  // A labelled block: chat messages one by one under their role, anything else as text.
  function turnPart(parent, title, content, className) {
    const wrap = newElement(parent, "div", null, "dash-part");
    newElement(wrap, "div", title, "dash-label");
    const isChat = Array.isArray(content) && content.length && content.every(m => m && typeof m === "object" && "role" in m);
    for (const m of isChat ? content : [{content}]) {
      if (isChat) newElement(wrap, "div", ROLE_LABELS[m.role] || m.role, "dash-role");
      newElement(wrap, "pre", messageText(m.content), className);
    }
  }
  const ROLE_LABELS = {system: "System prompt", user: "User", tool: "Tool result", assistant: "Assistant"};
  function messageText(v) { return v === null || v === undefined || v === "" ? "—" : typeof v === "string" ? v : JSON.stringify(v, null, 2); }
  function counted(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }
  function newElement(parent, tag, text, className) {
    const el = document.createElement(tag);
    if (text !== null) el.textContent = text;
    if (className) el.className = className;
    parent.appendChild(el);
    return el;
  }
  function fmt(v) { return v === null || v === undefined ? "—" : Number(v).toPrecision(4); }

  // -- toolbar ---------------------------------------------------------------------------------
  const search = document.getElementById("dash-search");
  search.addEventListener("change", async () => {
    const key = search.value.trim();
    if (!key || !state.keys.includes(key)) return;
    search.value = "";
    if (!state.series.has(key)) await loadSeries([key]);
    addChart(key, key, k => k === key);
  });
  document.getElementById("dash-smoothing").addEventListener("input", ev => {
    state.smoothing = parseFloat(ev.target.value);
    document.getElementById("dash-smoothing-value").textContent = state.smoothing.toFixed(2);
    state.charts.forEach(draw);
  });
  document.getElementById("dash-log-scale").addEventListener("change", ev => {
    state.logScale = ev.target.checked; state.charts.forEach(draw);
  });

  // -- start -----------------------------------------------------------------------------------
  (async function start() {
    await Promise.all([loadSeries(null), loadAttempts()]);
    // The first read holds the headline keys: the other charts' keys (system metrics) are read too.
    await loadKeys(state.keys.filter(key => chartFor(key) && !state.series.has(key)));
    gaps.complete = state.lastStep;
    for (const [id, title] of CHARTS) {
      const match = id.endsWith("/") ? (k => k.startsWith(id)) : (k => k === id);
      if ([...state.series.keys()].some(match)) addChart(id, title, match);
    }
    if (!state.charts.length) {
      const note = document.createElement("p");
      note.id = "dash-empty";
      note.className = "muted";
      note.textContent = FINAL.includes(state.status) ? "This run logged no metrics." :
        "The charts appear with the first logged step (reward, loss, KL, ...).";
      chartsBox.appendChild(note);
    }
    showLive();
    showProgress(0);
    if (progress && !FINAL.includes(state.status)) setInterval(() => showProgress(state.lastStep), 5000);
    connect();
    loadEpisodes(null);
  })();
})();
