// One stored episode read token by token: its turns as messages, its response tokens coloured by
// trained (mask 1, the model's) or not (mask 0, the environment's), a boundary where each model turn
// begins. Every text here is the run's (untrusted): set with textContent only.
(function () {
  const root = document.getElementById("token-view");
  if (!root) return;
  const note = document.getElementById("token-view-note");
  const el = (tag, className, text) => {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const number = value => typeof value === "number" ? (Number.isInteger(value) ? String(value) : value.toFixed(4)) : "—";
  const decimal = value => typeof value === "number" ? value.toFixed(4) : "—";
  const contentOf = message => {
    if (message === null || typeof message !== "object") return String(message ?? "");
    const content = message.content;
    return typeof content === "string" ? content : JSON.stringify(content ?? "");
  };

  function facts(e) {
    const list = document.getElementById("token-view-facts");
    const components = Object.entries(e.reward_components || {}).map(([k, v]) => k + " " + number(v)).join(", ");
    for (const [name, value] of [["Reward", number(e.reward)], ["Advantage", number(e.advantage)],
                                 ["Reward components", components || "—"], ["Termination", e.termination_reason || "—"],
                                 ["Turns", number(e.num_turns)], ["Source", e.data_source || "—"], ["Error", e.error || "—"],
                                 ["Retokenization", retokenization(e)]]) {
      list.appendChild(el("dt", "", name));
      list.appendChild(el("dd", "", value));
    }
  }

  // Where rendering the conversation again through the chat template stops giving back the ids generated.
  function driftInResponse(e) {
    if (e.retokenization_drift !== true || typeof e.drift_position !== "number") return null;
    return e.drift_position - (e.prompt_ids || []).length;  // negative: in the prompt
  }

  function retokenization(e) {
    if (e.retokenization_drift === false) return "the chat template renders the conversation back to the same token ids";
    if (e.retokenization_drift !== true) return "not checked";
    const at = driftInResponse(e);
    return at === null ? "drifts" : at < 0 ? "drifts in the prompt, at its token " + e.drift_position :
      "drifts at response token " + at + " (marked below)";
  }

  function driftFlag(e) {
    const flag = document.getElementById("token-view-drift");
    if (e.retokenization_drift !== true) return;
    flag.hidden = false;
    flag.textContent = "Retokenization drift: rendering this conversation again with the tokenizer's chat template " +
      "does not give back the token ids that were generated; " + retokenization(e) + ". What was trained on is " +
      "not what the conversation's text tokenizes to.";
  }

  function turns(e) {
    const box = document.getElementById("token-view-turns");
    (e.turns || []).forEach((turn, index) => {
      const section = el("section", "dash-turn token-view-turn");
      section.appendChild(el("h3", "", "Turn " + (index + 1) + " · reward " + number(turn.reward)));
      for (const message of turn.messages || []) {
        section.appendChild(el("h4", "", String((message && message.role) || "message")));
        section.appendChild(el("pre", "", contentOf(message)));
      }
      section.appendChild(el("h4", "", "assistant (the model's reply)"));
      section.appendChild(el("pre", "trained", String(turn.response ?? "")));
      box.appendChild(section);
    });
    if (!box.children.length) box.appendChild(el("p", "muted", "No turns recorded."));
  }

  function tokens(e) {
    const box = document.getElementById("token-view-tokens");
    const ids = e.token_ids || [], mask = e.mask || [], logprobs = e.logprobs || [], texts = e.token_texts || [];
    // A token's text piece as the trainer decoded it (line breaks and tabs made visible), else its id.
    const shown = i => typeof texts[i] === "string" ? (texts[i].replace(/\n/g, "↵").replace(/\t/g, "⇥") || "∅") : String(ids[i]);
    let turn = 0;
    const driftAt = driftInResponse(e);
    ids.forEach((id, i) => {
      const trained = mask[i] === 1;
      // A model turn begins where the model's tokens follow the environment's (or at the first token).
      if (trained && (i === 0 || mask[i - 1] !== 1)) {
        turn += 1;
        box.appendChild(el("span", "turn-boundary", "turn " + turn));
      }
      const token = el("span", "token " + (trained ? "trained" : "untrained") + (i === driftAt ? " drift" : ""), shown(i));
      token.title = "token " + id + " · " + (trained ? "trained" : "not trained (environment)") +
        " · logprob " + (i < logprobs.length ? decimal(logprobs[i]) : "not recorded") + " · advantage " + decimal(e.advantage) +
        (i === driftAt ? " · retokenization drifts here" : "");
      box.appendChild(token);
    });
    if (!ids.length) box.appendChild(el("p", "muted", "No response tokens recorded."));
  }

  fetch(root.dataset.url, { credentials: "same-origin" })
    .then(response => response.json().then(data => ({ ok: response.ok, data })))
    .then(({ ok, data }) => {
      if (!ok) { note.textContent = "This episode could not be read: " + (data.detail || "error"); return; }
      note.textContent = (data.token_ids || []).length + " response tokens, " + (data.mask || []).filter(m => m === 1).length + " trained";
      driftFlag(data); facts(data); turns(data); tokens(data);
    })
    .catch(error => { note.textContent = "This episode could not be read: " + error; });
})();
