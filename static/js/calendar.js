// Calendar: click or drag across free cells (and GPU rows of one node) to book.
// Without JavaScript every cell is a link to the booking form; this only adds
// drag selection and loads the form next to the calendar with htmx.
(() => {
  const grid = document.getElementById("calendar-grid");
  const panel = document.getElementById("booking-panel");
  if (!grid || !panel) return;

  let anchor = null;
  let current = null;
  let dragged = false;

  const cellInfo = (cell) => {
    const row = cell.closest(".cal-row");
    return { cell, row, node: row.dataset.node, col: Number(cell.dataset.col) };
  };

  const rowsOfNode = (node) => Array.from(grid.querySelectorAll(`.cal-row[data-node="${node}"]`));

  const selection = () => {
    if (!anchor || !current) return [];
    const rows = rowsOfNode(anchor.node);
    const r1 = rows.indexOf(anchor.row);
    const r2 = current.node === anchor.node ? rows.indexOf(current.row) : r1;
    const [rowLo, rowHi] = [Math.min(r1, r2), Math.max(r1, r2)];
    const [colLo, colHi] = [Math.min(anchor.col, current.col), Math.max(anchor.col, current.col)];
    const cells = [];
    rows.slice(rowLo, rowHi + 1).forEach((row) => {
      row.querySelectorAll("a.cal-cell").forEach((cell) => {
        const col = Number(cell.dataset.col);
        if (col >= colLo && col <= colHi) cells.push(cell);
      });
    });
    return cells;
  };

  const paint = () => {
    grid.querySelectorAll(".cal-cell.selected").forEach((c) => c.classList.remove("selected"));
    selection().forEach((c) => c.classList.add("selected"));
  };

  const bookingUrl = () => {
    const cells = selection();
    if (!cells.length) return null;
    const gpus = new Set();
    let start = null;
    let end = null;
    cells.forEach((cell) => {
      gpus.add(cell.closest(".cal-row").dataset.gpu);
      // Each cell's start and end are in its link (local ISO minutes: they sort as text).
      const link = new URL(cell.href).searchParams;
      if (start === null || link.get("start") < start) start = link.get("start");
      if (end === null || link.get("end") > end) end = link.get("end");
    });
    const params = new URLSearchParams();
    gpus.forEach((gpu) => params.append("gpus", gpu));
    params.set("start", start);
    params.set("end", end);
    return `${grid.dataset.bookUrl}?${params.toString()}`;
  };

  grid.addEventListener("pointerdown", (event) => {
    const cell = event.target.closest("a.cal-cell");
    if (!cell || event.button !== 0) return;
    event.preventDefault();
    anchor = cellInfo(cell);
    current = anchor;
    dragged = true;
    paint();
  });

  grid.addEventListener("pointerover", (event) => {
    if (!anchor) return;
    const cell = event.target.closest("a.cal-cell");
    if (!cell) return;
    current = cellInfo(cell);
    paint();
  });

  document.addEventListener("pointerup", () => {
    if (!anchor) return;
    const url = bookingUrl();
    anchor = null;
    if (!url) return;
    if (window.htmx) {
      window.htmx.ajax("GET", url, { target: "#booking-panel", swap: "innerHTML" });
      panel.scrollIntoView({ block: "nearest" });
    } else {
      window.location.href = url;
    }
  });

  // A mouse click already handled by the pointer events must not also follow the link;
  // keyboard activation (Enter) still does.
  grid.addEventListener("click", (event) => {
    if (dragged && event.target.closest("a.cal-cell")) {
      event.preventDefault();
      dragged = false;
    }
  });

  // Where the grid is wider than the screen (a phone), open it at the current time, with
  // the two cells before it in view, instead of at midnight.
  const scroller = grid.closest(".cal-scroll");
  const now = grid.querySelector(".cal-now");
  if (scroller && now && scroller.scrollWidth > scroller.clientWidth) {
    const label = grid.querySelector(".cal-label");
    const track = now.parentElement;
    const x = track.offsetLeft + (track.clientWidth * parseFloat(now.style.left)) / 100;
    const cell = track.clientWidth / (Number(grid.style.getPropertyValue("--cols")) || 48);
    scroller.scrollLeft = Math.max(0, x - (label ? label.offsetWidth : 0) - 2 * cell);
  }
})();
