// The terminal page: xterm.js over the portal's WebSocket to a shell in the job.
// Binary frames carry the terminal's bytes both ways; {"resize": [cols, rows]} resizes.
(function () {
  "use strict";
  function start() {
    const box = document.getElementById("terminal");
    if (!box || !window.Terminal) return;
    const term = new window.Terminal({ cursorBlink: true, convertEol: false });
    const fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = scheme + "//" + location.host + box.dataset.wsPath + "?cols=" + term.cols + "&rows=" + term.rows;
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    const encoder = new TextEncoder();
    ws.onmessage = function (event) {
      term.write(typeof event.data === "string" ? event.data : new Uint8Array(event.data));
    };
    ws.onclose = function (event) {
      term.write("\r\n[" + box.dataset.closedText + (event.reason ? " " + event.reason : "") + "]\r\n");
      box.dataset.closed = String(event.code);
    };
    ws.onopen = function () { box.dataset.open = "1"; term.focus(); };
    term.onData(function (data) {
      if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data));
    });
    term.onResize(function (size) {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ resize: [size.cols, size.rows] }));
    });
    window.addEventListener("resize", function () { fit.fit(); });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
