// Time-series charts drawn with uPlot (installed from npm, served by the portal).
// Each <div data-chart="..."> names a JSON series endpoint of the REST API in
// data-chart-url; labels come translated from the template's data attributes.
(function () {
  "use strict";
  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2",
    "#db2777", "#65a30d", "#ea580c", "#4f46e5", "#0d9488", "#9333ea"];

  function lines(body, el) {
    const kind = el.dataset.chart;
    if (kind === "lab-daily") {
      const days = body.map((d) => Date.parse(d.day + "T00:00:00Z") / 1000);
      const share = body.map((d) => (d.allocated_share === null ? null : d.allocated_share * 100));
      const util = body.map((d) => d.util_mean);
      return {
        x: days,
        series: [
          { label: el.dataset.labelAllocated, values: share },
          { label: el.dataset.labelUtil, values: util },
        ],
        percent: true,
      };
    }
    const source = el.dataset.lines === "nodes" ? body.nodes : body.gpus;
    const memory = kind === "memory";
    return {
      x: body.timestamps,
      series: source.map((line) => ({
        label: line.label || line.node,
        values: memory
          ? line.mem_used_mb.map((v) => (v === null ? null : Math.round((v / 1024) * 10) / 10))
          : line.util,
      })),
      percent: !memory,
    };
  }

  function draw(el, body) {
    const chart = lines(body, el);
    const points = chart.series.reduce(
      (n, s) => n + s.values.filter((v) => v !== null && v !== undefined).length, 0);
    el.dataset.points = String(points);
    el.textContent = "";
    if (body.simulated && el.dataset.simulatedText) {
      const note = document.createElement("p");
      note.className = "chart-note sim";
      note.textContent = el.dataset.simulatedText;
      el.appendChild(note);
    }
    if (points === 0) {
      const empty = document.createElement("p");
      empty.className = "chart-empty";
      empty.textContent = el.dataset.emptyText || "";
      el.appendChild(empty);
      return;
    }
    const unit = chart.percent ? "%" : " GiB";
    const opts = {
      width: Math.max(280, el.clientWidth),
      height: Number(el.dataset.height || 220),
      series: [{ label: el.dataset.labelTime || "Time" }].concat(chart.series.map((s, i) => ({
        label: s.label,
        stroke: PALETTE[i % PALETTE.length],
        width: 1.5,
        spanGaps: false,
        value: (u, v) => (v === null || v === undefined ? "—" : v.toFixed(1) + unit),
      }))),
      scales: chart.percent ? { y: { range: [0, 100] } } : {},
      axes: [{}, { values: (u, ticks) => ticks.map((t) => t + unit), size: 60 }],
      legend: { live: true },
    };
    const data = [chart.x].concat(chart.series.map((s) => s.values));
    // eslint-disable-next-line no-undef
    const plot = new uPlot(opts, data, el);
    new ResizeObserver(() => plot.setSize({ width: Math.max(280, el.clientWidth), height: opts.height }))
      .observe(el);
  }

  function load(el) {
    fetch(el.dataset.chartUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((response) => {
        if (!response.ok) throw new Error(response.status + " " + response.statusText);
        return response.json();
      })
      .then((body) => draw(el, body))
      .catch((error) => {
        el.dataset.points = "0";
        el.textContent = (el.dataset.errorText || "") + " (" + error.message + ")";
      });
  }

  function start() {
    document.querySelectorAll("[data-chart][data-chart-url]").forEach(load);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
