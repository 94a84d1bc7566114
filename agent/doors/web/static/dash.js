// nightshift dashboard: the live log (polled, bounded), the metric curves (SVG from JSON), and
// forms that send once. No framework, nothing from another site; values go in as text only.
"use strict";
(function () {
  const MAX_LINES = 2000;

  // A form sends once: its buttons are disabled as it goes (the server counts a nonce once too).
  document.addEventListener("submit", function (ev) {
    const form = ev.target;
    if (form.dataset.sent) { ev.preventDefault(); return; }
    form.dataset.sent = "1";
    setTimeout(function () {
      form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    }, 0);
  });

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); });
  }

  // ---------------------------------------------------------------------------- the live log
  const pre = document.getElementById("log");
  if (pre) {
    const src = pre.dataset.src;
    const status = document.getElementById("log-status");
    const stateEl = document.getElementById("job-state");
    let attempt = null, offset = null, lines = [];
    function show(newLines, header) {
      if (header) lines.push(header);
      lines = lines.concat(newLines);
      if (lines.length > MAX_LINES) lines = lines.slice(lines.length - MAX_LINES);
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = lines.join("\n");
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    }
    function poll() {
      let url = src;
      if (offset !== null) url += "?attempt=" + attempt + "&offset=" + offset;
      getJSON(url).then(function (r) {
        if (!r.ok) { status.textContent = r.body.error || "unavailable"; return; }
        const d = r.body;
        if (offset === null || d.attempt !== attempt) {
          show(d.lines, d.attempt ? "── attempt " + d.attempt + " ──" : null);
        } else {
          show(d.lines, null);
        }
        attempt = d.attempt; offset = d.offset;
        if (d.latest_attempt && attempt !== null && d.latest_attempt > attempt && d.attempt_ended && !d.more) {
          attempt = d.latest_attempt; offset = 0;
          lines.push("── attempt " + attempt + " ──");
        }
        status.textContent = d.state + (d.final ? " (ended)" : "");
        if (stateEl) stateEl.textContent = d.state;
        pre.dataset.offset = String(offset);
        if (!d.final || d.more) setTimeout(poll, d.more ? 100 : 1000);
        if (d.attempt === null && !d.final) { offset = null; }
      }).catch(function () { status.textContent = "reconnecting…"; setTimeout(poll, 3000); });
    }
    poll();
  }

  // ---------------------------------------------------------------------------- metric curves
  const curves = document.getElementById("curves");
  const NS = "http://www.w3.org/2000/svg";
  function el(name, attrs, text) {
    const n = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { n.setAttribute(k, String(attrs[k])); });
    if (text !== undefined) n.textContent = text;
    return n;
  }
  function plot(name, pts) {
    const W = 480, H = 200, L = 56, B = 24, T = 18;
    const svg = el("svg", { viewBox: "0 0 " + W + " " + H, class: "curve", "data-metric": name });
    const xs = pts.map(function (p) { return p[0]; }), ys = pts.map(function (p) { return p[1]; });
    const x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    const y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    const sx = function (x) { return L + (W - L - 8) * (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5); };
    const sy = function (y) { return H - B - (H - B - T) * (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5); };
    svg.appendChild(el("text", { x: L, y: 12, class: "title" }, name));
    svg.appendChild(el("line", { x1: L, y1: H - B, x2: W - 8, y2: H - B, class: "axis" }));
    svg.appendChild(el("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
    svg.appendChild(el("text", { x: 2, y: T + 8, class: "tick" }, y1.toPrecision(4)));
    svg.appendChild(el("text", { x: 2, y: H - B, class: "tick" }, y0.toPrecision(4)));
    svg.appendChild(el("text", { x: L, y: H - 6, class: "tick" }, "step " + x0));
    svg.appendChild(el("text", { x: W - 80, y: H - 6, class: "tick" }, "step " + x1));
    const d = pts.map(function (p, i) { return (i ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1); }).join(" ");
    svg.appendChild(el("path", { d: d, class: "line" }));
    return svg;
  }
  function drawCurves() {
    getJSON(curves.dataset.src).then(function (r) {
      curves.textContent = "";
      if (!r.ok) { curves.textContent = r.body.error || "unavailable"; return; }
      const names = Object.keys(r.body.series).sort();
      if (!names.length) { curves.textContent = "No metric points yet."; }
      names.forEach(function (n) { curves.appendChild(plot(n, r.body.series[n])); });
      const st = document.getElementById("job-state");
      if (!st || st.textContent === "running" || st.textContent === "queued") setTimeout(drawCurves, 5000);
    }).catch(function () { setTimeout(drawCurves, 5000); });
  }
  if (curves) drawCurves();
})();
