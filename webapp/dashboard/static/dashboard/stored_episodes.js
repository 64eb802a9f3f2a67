// The run page's list of every stored episode: the API's filters as a form, a page at a time.
(function () {
  const box = document.getElementById("stored-episodes");
  if (!box) return;
  const form = document.getElementById("stored-episodes-filter");
  const body = document.querySelector("#stored-episodes-list tbody");
  const note = document.getElementById("stored-episodes-note");
  const more = document.getElementById("stored-episodes-more");
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

  async function load(url, append) {
    const response = await fetch(url, { credentials: "same-origin" });
    const data = await response.json();
    if (!response.ok) {
      note.textContent = Object.entries(data).map(([name, errors]) => name + ": " + [].concat(errors).join(" ")).join("; ");
      return;
    }
    if (!append) body.innerHTML = "";
    for (const e of data.results) {
      const tr = document.createElement("tr");
      // Each episode opens its token view, a page of its own (shareable, with a share link's token).
      const href = box.dataset.pageUrl + Number(e.id) + "/" + box.dataset.shareQuery;
      for (const [i, v] of [e.id, e.split, e.step, e.group.slice(0, 8), e.reward, e.termination_reason, e.data_source].entries()) {
        const td = document.createElement("td");
        if (i === 0) { const a = document.createElement("a"); a.href = href; a.textContent = show(v); td.appendChild(a); }
        else td.textContent = show(v);
        tr.appendChild(td);
      }
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
  }
  form.addEventListener("submit", ev => { ev.preventDefault(); refresh(); });
  refresh();
})();
