// flowserve ui: draws the graph the server laid out as SVG and polls the JSON endpoints for live figures.
// Shipped with the package; nothing is loaded from anywhere else.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
let W = 270, H = 96;  // set from the graph the server laid out
const token = new URLSearchParams(location.hash.slice(1)).get("token") || sessionStorage.getItem("fs-token");
if (token) sessionStorage.setItem("fs-token", token);
let topologies = [], current = null, pollMs = 2000, timer = null, chosen = null;

async function api(path) {
  const headers = token ? {Authorization: "Bearer " + token} : {};
  const res = await fetch("/api/" + path, {headers});
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function el(tag, attrs, parent, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}

// Everything read from the topics (error reasons, component descriptions, detector keys) is escaped
// before it goes into markup: a request's content can end up in an error reason.
function esc(v) {
  return String(v === null || v === undefined ? "" : v).replace(/[&<>"']/g,
    c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
}

function fmt(v, digits) {
  if (v === null || v === undefined) return "-";
  if (typeof v !== "number") return String(v);
  if (Math.abs(v) >= 1000) return (v / 1000).toFixed(1) + "k";
  return v.toFixed(digits === undefined ? (Number.isInteger(v) ? 0 : 1) : digits);
}

function drawGraph(g) {
  const svg = document.getElementById("graph");
  svg.innerHTML = "";
  W = g.node_w;
  H = g.node_h;
  svg.setAttribute("viewBox", `0 0 ${g.width} ${g.height}`);
  svg.setAttribute("width", g.width);
  svg.setAttribute("height", g.height);
  const defs = el("defs", {}, svg);
  const marker = el("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7,
                               markerHeight: 7, orient: "auto-start-reverse"}, defs);
  el("path", {d: "M0,0 L10,5 L0,10 z", fill: "#9aa3af"}, marker);
  const pos = {};
  for (const n of g.nodes) pos[n.id] = n;
  const edges = el("g", {}, svg);
  for (const e of g.edges) {
    const a = pos[e.from], b = pos[e.to];
    if (!a || !b) continue;
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
    const d = x2 > x1 ? `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`
                      : `M${a.x + W / 2},${a.y + H} C${a.x + W / 2},${a.y + H + 60} ${b.x + W / 2},${b.y + H + 60} ${b.x + W / 2},${b.y + H}`;
    const p = el("path", {d, class: "edge " + e.kind, "data-from": e.from, "data-to": e.to}, edges);
    el("title", {}, p, `${e.from} → ${e.to}.${e.port}\n${e.topic}`);
  }
  for (const n of g.nodes) {
    const endpoint = n.kind === "input" || n.kind === "outputs";
    const grp = el("g", {class: `node kind-${n.kind}` + (endpoint ? " endpoint" : ""), "data-node": n.id,
                         transform: `translate(${n.x},${n.y})`}, svg);
    el("rect", {width: W, height: H, rx: 6}, grp);
    el("text", {x: 8, y: 16, class: "title"}, grp, n.id);
    let sub = endpoint ? n.label : n.component + (n.join ? ` · join ${n.join}` : "")
      + (n.kind === "side" ? " · side" : "") + (n.members && n.members.length ? " · fused" : "");
    el("text", {x: 8, y: 30, class: "sub"}, grp, sub.length > 46 ? sub.slice(0, 45) + "…" : sub);
    const ports = endpoint ? (n.ports.out || n.ports.in).join(", ")
      : `in: ${n.ports.in.join(", ")}  out: ${n.ports.out.join(", ")}`;
    el("text", {x: 8, y: 42, class: "sub"}, grp, ports.length > 50 ? ports.slice(0, 49) + "…" : ports);
    if (!endpoint) {
      for (let i = 0; i < 3; i++) el("text", {x: 8, y: 58 + i * 13, class: "figs", "data-line": i}, grp, i ? "" : "waiting for metrics…");
    }
    el("text", {x: W - 6, y: 16, class: "hop", "text-anchor": "end", "data-hop": n.id}, grp, "");
    if (!endpoint) grp.addEventListener("click", () => choose(n.id));
    const tip = el("title", {}, grp, n.id);
    tip.textContent = endpoint ? n.label : `${n.id}: ${n.component}\n` +
      Object.entries(n.topics || {}).map(([p, t]) => `${p} → ${t}`).join("\n") +
      (n.members && n.members.length ? `\nfused: ${n.members.join(" → ")}` : "");
  }
}

// A node metering energy (flowserve run --energy): millijoules (active + idle) per answered request; the
// totals and grams CO2e are in flowserve stats (the node's figure line has room for one more figure).
function energy(c) {
  if (c.energy_mj === undefined || !c.requests_ok) return "";
  return ` · ${fmt((c.energy_mj + (c.energy_idle_mj || 0)) / c.requests_ok)} mJ/req`;
}

function updateGraph(stats) {
  for (const [id, f] of Object.entries(stats.nodes)) {
    const grp = document.querySelector(`g.node[data-node="${CSS.escape(id)}"]`);
    if (!grp) continue;
    grp.classList.remove("h-ok", "h-lagging", "h-failing", "h-down", "h-unknown");
    grp.classList.add("h-" + f.health);
    const c = f.counters || {};
    const lines = f.workers === 0 ? ["no worker reporting", "", ""] : [
      `${f.workers} consumer(s) · lag ${fmt(f.lag)} · batch ${fmt(f.batch_mean)} (p99 ${fmt(f.batch_p99)})`,
      `exec p50/p99 ${fmt(f.exec_p50_ms)}/${fmt(f.exec_p99_ms)} ms · wait p99 ${fmt(f.wait_p99_ms)} ms`,
      `${fmt(f.rate_rps)} req/s · ok ${fmt(c.requests_ok)} · refused ${fmt(c.refused)} · dead ${fmt(c.dead_lettered)}` +
        (c.cache_hits !== undefined ? ` · cache ${fmt(c.cache_hits)}/${fmt(c.cache_hits + c.cache_misses)} hits` : "") +
        energy(c),
    ];
    grp.querySelectorAll("text.figs").forEach((t, i) => { t.textContent = lines[i]; });
    grp.setAttribute("data-health", f.health);
  }
}

function sparkline(parent, title, points, key, opts) {
  opts = opts || {};
  const box = document.createElement("div");
  box.className = "chart";
  const last = points.length ? points[points.length - 1][key] : null;
  box.innerHTML = `<h3>${esc(title)}</h3><div class="metric"><span>${esc(opts.unit)}</span><span>now ${esc(fmt(last, 2))}</span></div>`;
  const svg = el("svg", {viewBox: "0 0 240 54", preserveAspectRatio: "none"}, box);
  const vals = points.map(p => p[key]).filter(v => typeof v === "number");
  const top = Math.max(opts.top || 0, ...vals, 1e-9);
  if (vals.length > 1) {
    const xs = (i) => (i / (points.length - 1)) * 238 + 1;
    const ys = (v) => 52 - (v / top) * 50;
    el("polyline", {class: "line", points: points.map((p, i) => `${xs(i)},${ys(p[key] || 0)}`).join(" ")}, svg);
    if (opts.threshold !== undefined) el("line", {class: "threshold", x1: 0, x2: 240, y1: ys(opts.threshold), y2: ys(opts.threshold)}, svg);
  }
  el("title", {}, svg, `${title}: max ${fmt(top, 3)}`);
  parent.appendChild(box);
}

function drawCharts(history) {
  const charts = document.getElementById("charts");
  charts.innerHTML = "";
  document.getElementById("charts-title").textContent = chosen ? `last minutes: ${chosen}` : "last minutes per node";
  for (const [node, pts] of Object.entries(history.nodes)) {
    if (chosen && node !== chosen) continue;
    sparkline(charts, `${node} · rate`, pts, "rate_rps", {unit: "req/s"});
    sparkline(charts, `${node} · exec p99`, pts, "exec_p99_ms", {unit: "ms"});
    sparkline(charts, `${node} · lag`, pts, "lag", {unit: "records"});
    sparkline(charts, `${node} · batch size`, pts, "batch_mean", {unit: "mean requests"});
  }
  const drift = document.getElementById("drift");
  drift.innerHTML = "";
  for (const [key, pts] of Object.entries(history.drift || {})) {
    const thr = pts.length ? pts[pts.length - 1].threshold : undefined;
    sparkline(drift, `${key} · p-value (${pts.filter(p => p.is_drift).length} drifted)`, pts, "p_val",
              {unit: "per window; red: threshold", threshold: thr, top: 1});
  }
}

function drawSide(stats) {
  document.getElementById("drift-panel").hidden = !stats.panels.drift;
  document.getElementById("actions-panel").hidden = !stats.panels.actions;
  const ul = document.getElementById("actions");
  ul.innerHTML = "";
  for (const a of (stats.actions || []).slice().reverse()) {
    const li = document.createElement("li");
    const node = a.node ? ` ${a.node}` : "";  // the tuner's and the parity decoder's actions name their node
    li.textContent = `${a.ts_ms ? new Date(a.ts_ms).toLocaleTimeString() : ""} ${a.source || ""}${node}: ${JSON.stringify(a.action)}`;
    ul.appendChild(li);
  }
  if (!ul.children.length) ul.innerHTML = "<li>none yet</li>";
  drawModels(stats);
}

function drawModels(stats) {
  // many-model nodes (flowserve.models): the busiest models, and where a placement agent sends them
  document.getElementById("models-panel").hidden = !stats.panels.models;
  const cols = ["model", "resident", "loads", "evictions", "refusals", "answers", "placed"];
  const rows = (stats.models || []).map(m => "<tr>" + cols.map(c => `<td>${esc(
    c === "placed" ? (m.placed.length ? m.placed.join(",") : "home") : m[c])}</td>`).join("") + "</tr>");
  document.getElementById("models").innerHTML =
    "<tr>" + cols.map(c => `<th>${c}</th>`).join("") + "</tr>" + rows.join("");
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const [stats, history] = await Promise.all([api(`${current}/stats`), api(`${current}/history?last=150`)]);
    updateGraph(stats);
    drawCharts(history);
    drawSide(stats);
    status.textContent = stats.error ? "reading topics failed: " + stats.error
      : "updated " + new Date(stats.updated_ms || Date.now()).toLocaleTimeString();
    status.className = "status" + (stats.error ? " error" : "");
  } catch (err) {
    status.textContent = "error: " + err.message;
    status.className = "status error";
  }
}

function clearLineage() {
  document.querySelectorAll(".on-path").forEach(e => e.classList.remove("on-path"));
  document.querySelectorAll("text.hop").forEach(t => { t.textContent = ""; });
  document.getElementById("lineage-panel").hidden = true;
}

async function lookUp(ev) {
  ev.preventDefault();
  const rid = document.getElementById("request-id").value.trim();
  const out = document.getElementById("lineage");
  clearLineage();
  document.getElementById("lineage-panel").hidden = false;
  out.textContent = "looking up " + rid + "…";
  try {
    const lin = await api(`${current}/lineage?id=${encodeURIComponent(rid)}`);
    const nodes = new Set(lin.steps.map(s => s.node));
    nodes.add("input");
    if (lin.steps.some(s => s.outputs.some(o => o.topic.endsWith(".outputs")))) nodes.add("outputs");
    document.querySelectorAll("g.node").forEach(g => { if (nodes.has(g.dataset.node)) g.classList.add("on-path"); });
    document.querySelectorAll("path.edge").forEach(p => {
      if (nodes.has(p.dataset.from) && nodes.has(p.dataset.to)) p.classList.add("on-path");
    });
    lin.steps.forEach((s, i) => {
      const t = document.querySelector(`text.hop[data-hop="${CSS.escape(s.node)}"]`);
      if (t) t.textContent = `#${i + 1} ${fmt(s.batch_ms, 2)} ms`;
    });
    const rows = lin.steps.map((s, i) => `<tr><td>${i + 1}</td><td><b>${esc(s.node)}</b><br><code>${esc(s.component)}</code></td>` +
      `<td>+${esc(fmt(s.offset_ms, 1))} ms</td><td>${esc(fmt(s.batch_ms, 2))} ms<br>batch ${esc(s.batch_size)} (#${esc(s.batch_index)})</td>` +
      `<td>${s.inputs.map(x => `<code>${esc(x.topic)} p${esc(x.partition)}@${esc(x.offset)}</code><br>` +
        (x.tensors || []).map(t => `<code>${esc(t)}</code>`).join("<br>")).join("<br>")}</td>` +
      `<td>${s.error ? `<span class="error">${esc(s.error)}</span>` : "ok"}</td></tr>`).join("");
    out.innerHTML = `<p>request <code id="lineage-rid">${esc(lin.request_id)}</code>: ${lin.steps.length} hop(s), trace <code>${esc(lin.trace_id || "-")}</code></p>` +
      `<table id="lineage-table"><tr><th>#</th><th>node</th><th>start</th><th>batch time</th><th>inputs read (tensor summaries)</th><th></th></tr>${rows}</table>` +
      (lin.explanations || []).map(explanationHtml).join("");
  } catch (err) {
    out.innerHTML = `<p class="error">${esc(err.message)}</p>`;
  }
}

// One explanation (flowserve.explain): per row, each attributed input drawn as a heat map where it is a
// square image (red: raised the explained score, blue: lowered it; the strongest pixel is fully coloured).
function explanationHtml(e) {
  if (e.error) return `<p class="error">explanation of ${esc(e.output)}: ${esc(e.error)}</p>`;
  const maps = Object.entries(e.attributions || {}).map(([name, a]) => {
    const per = a.shape.slice(1).reduce((x, y) => x * y, 1), side = Math.round(Math.sqrt(per));
    if (side * side !== per || side < 2) return "";
    return a.data.reduce((rows, v, i) => { if (i % per === 0) rows.push([]); rows[rows.length - 1].push(v); return rows; }, [])
      .map((row, r) => {
        const peak = Math.max(...row.map(Math.abs)) || 1;
        const cells = row.map(v => `<div class="cell" data-value="${v}" style="background:${v >= 0 ? "rgba(208,52,44," : "rgba(59,111,214,"}${(Math.abs(v) / peak).toFixed(3)})"></div>`).join("");
        return `<figure><div class="heatmap" style="grid-template-columns:repeat(${side},14px)">${cells}</div>` +
          `<figcaption>${esc(name)} row ${r}: class ${esc((e.classes || [])[r])}, f(x) ${esc(fmt(e.f_x[r], 4))}, ` +
          `baseline ${esc(fmt(e.f_baseline[r], 4))}, gap ${esc(Number(e.delta[r]).toExponential(1))}</figcaption></figure>`;
      }).join("");
  }).join("");
  return `<div class="explanation"><p>explanation (${esc(e.method)}) of <b>${esc(e.output)}</b></p>${maps}</div>`;
}

function choose(node) {
  chosen = chosen === node ? null : node;
  document.querySelectorAll("g.node").forEach(g => g.classList.toggle("chosen", g.dataset.node === chosen));
  poll();
}

function select(name) {
  current = name;
  chosen = null;
  const g = topologies.find(t => t.topology === name);
  document.getElementById("meta").textContent = `v${g.version} · ${g.partitions} partition(s) · ${g.nodes.length - 2} node(s)`;
  drawGraph(g);
  clearLineage();
  poll();
}

async function start() {
  try {
    const body = await api("topologies");
    topologies = body.topologies;
    pollMs = Math.max(500, body.poll_s * 1000);
  } catch (err) {
    document.getElementById("status").textContent = "error: " + err.message;
    document.getElementById("status").className = "status error";
    return;
  }
  const sel = document.getElementById("topology");
  for (const t of topologies) sel.add(new Option(t.topology, t.topology));
  sel.onchange = () => select(sel.value);
  document.getElementById("lineage-form").onsubmit = lookUp;
  document.getElementById("lineage-clear").onclick = clearLineage;
  document.getElementById("fit").onclick = (ev) => {
    const fit = document.getElementById("graph").classList.toggle("fit");
    ev.target.textContent = fit ? "actual size" : "fit to width";
  };
  select(topologies[0].topology);
  timer = setInterval(poll, pollMs);
}

start();
