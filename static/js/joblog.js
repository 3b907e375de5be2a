// The job page's live log (joblogs): follows the output by offset, with pause, search
// and a filter. No inline script (the CSP forbids it): the panel's data attributes
// carry the API's URL and the translated labels.
(function () {
  "use strict";
  const panel = document.querySelector("[data-job-log]");
  if (!panel) return;
  const out = panel.querySelector("[data-log-output]");
  const followButton = panel.querySelector("[data-log-follow]");
  const search = panel.querySelector("[data-log-search]");
  const filter = panel.querySelector("[data-log-filter]");
  const status = panel.querySelector("[data-log-status]");
  const label = (name) => panel.dataset["label" + name] || "";
  // The page keeps the newest 4 million characters; the download has all of it.
  const MAX_CHARS = 4000000;
  let text = "";
  let offset = null;
  let following = true;
  let ended = false;

  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }

  function setFollowing(on) {
    following = on;
    followButton.setAttribute("aria-pressed", on ? "true" : "false");
    followButton.textContent = on ? label("Pause") : label("Follow");
    if (on) out.scrollTop = out.scrollHeight;
  }

  function render() {
    const query = search.value;
    out.textContent = "";
    if (!text) { out.textContent = label("Empty"); return; }
    if (!query) { out.textContent = text; return; }
    const needle = query.toLowerCase();
    const lines = text.split("\n");
    const fragment = document.createDocumentFragment();
    let matches = 0;
    lines.forEach(function (line, index) {
      const lower = line.toLowerCase();
      const hit = lower.indexOf(needle) >= 0;
      if (hit) matches += 1;
      if (filter.checked && !hit) return;
      let from = 0;
      let at = lower.indexOf(needle);
      while (at >= 0) {
        fragment.appendChild(document.createTextNode(line.slice(from, at)));
        const mark = document.createElement("mark");
        mark.textContent = line.slice(at, at + query.length);
        fragment.appendChild(mark);
        from = at + query.length;
        at = lower.indexOf(needle, from);
      }
      fragment.appendChild(document.createTextNode(line.slice(from) + (index < lines.length - 1 ? "\n" : "")));
    });
    out.appendChild(fragment);
    status.dataset.matches = String(matches);
    status.textContent = label("Matches").replace("%(count)s", String(matches));
  }

  function showStatus(body) {
    if (search.value) return; // the match count is shown instead
    const parts = [label("Size").replace("%(size)s", bytes(body.size))];
    if (body.dropped_bytes) parts.push(label("Dropped").replace("%(dropped)s", bytes(body.dropped_bytes)));
    if (ended) parts.push(label("Ended"));
    status.textContent = parts.join(" · ");
  }

  function add(more) {
    if (!more) return;
    text += more;
    if (text.length > MAX_CHARS) text = text.slice(text.length - MAX_CHARS);
    if (!search.value && out.firstChild && out.textContent !== label("Empty")) {
      out.appendChild(document.createTextNode(more));
      if (out.textContent.length > MAX_CHARS) out.textContent = text;
    } else {
      render();
    }
    if (following) out.scrollTop = out.scrollHeight;
  }

  async function poll() {
    const url = panel.dataset.url + (offset === null ? "?tail=1000" : "?offset=" + offset);
    let body;
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(String(response.status));
      body = await response.json();
    } catch (error) {
      status.textContent = label("Error");
      window.setTimeout(poll, 5000);
      return;
    }
    if (!body.full) {
      // No full log (an agent of an earlier release): the tail the job page had.
      text = body.text;
      render();
      ended = body.complete;
    } else {
      if (offset === null) { text = ""; out.textContent = ""; }
      add(body.text);
      if (offset === null && !body.text) render();
      offset = body.next_offset;
      ended = body.complete && body.next_offset >= body.size;
    }
    showStatus(body);
    if (!ended) window.setTimeout(poll, body.text ? 300 : 1500);
  }

  followButton.addEventListener("click", function () { setFollowing(!following); });
  out.addEventListener("scroll", function () {
    const atBottom = out.scrollHeight - out.scrollTop - out.clientHeight < 24;
    if (following && !atBottom) setFollowing(false);
  });
  let searchTimer = null;
  function researched() {
    window.clearTimeout(searchTimer);
    searchTimer = window.setTimeout(function () { render(); if (following) out.scrollTop = out.scrollHeight; }, 150);
  }
  search.addEventListener("input", researched);
  filter.addEventListener("change", researched);
  setFollowing(true);
  poll();
})();
