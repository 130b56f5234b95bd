#include "keel/monitor/dashboard_page.h"

namespace keel::monitor {
namespace {

constexpr const char* kPage = R"PAGE(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>@@TITLE@@</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; background: #fafafa; }
h1 { font-size: 18px; margin: 0 0 8px; } h2 { font-size: 14px; margin: 0 0 4px; }
table { border-collapse: collapse; margin: 8px 0 16px; background: #fff; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr)); gap: 12px; }
.panel { background: #fff; border: 1px solid #ddd; padding: 8px; height: 300px; position: relative; }
.panel canvas { width: 100% !important; height: 260px !important; }
body.only .grid { display: block; } body.only .panel { display: none; }
body.only .panel.shown { display: block; height: 460px; }
body.only .panel.shown canvas { height: 420px !important; }
body.only #summary, body.only h1 { display: none; }
#status { color: #777; font-size: 12px; }
#warnings { color: #b00; }
</style>
@@CHARTJS@@
</head><body>
<h1>@@TITLE@@ <span id="status"></span></h1>
<div id="warnings"></div>
<div id="summary"></div>
<div class="grid" id="grid"></div>
<pre id="state" hidden></pre>
<script>
"use strict";
const KEEL = @@CONFIG@@;
const errors = [];
window.addEventListener("error", e => errors.push(String(e.message)));
window.addEventListener("unhandledrejection", e => errors.push(String(e.reason)));
const consoleError = console.error.bind(console);
console.error = (...a) => { errors.push(a.map(String).join(" ")); consoleError(...a); };

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"];
// A series' own colours where one chart holds two of a run's (train and validation loss).
const ALT_COLORS = ["#ff7f0e", "#17becf", "#bcbd22", "#e377c2", "#8c564b", "#7f7f7f", "#2ca02c"];
const PHASES = [["data_ms", "data"], ["forward_ms", "forward"], ["head_ms", "head"],
  ["backward_ms", "backward"],
  ["dp_wait_ms", "dp wait"], ["tp_wait_ms", "tp wait"], ["cp_wait_ms", "cp wait"],
  ["pp_wait_ms", "pp wait"],
  ["tied_wait_ms", "tied wait"], ["sync_wait_ms", "sync wait"], ["optim_ms", "optimizer"],
  ["ckpt_ms", "checkpoint"], ["checks_ms", "checks"], ["val_ms", "validation"],
  ["other_ms", "other"]];
const PHASE_COLORS = ["#bbbbbb", "#4e79a7", "#d37295", "#f28e2b", "#e15759", "#76b7b2", "#86bcb6",
  "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#17becf", "#7f7f7f"];
const EVENT_COLORS = { checkpoint: "#2ca02c", start: "#1f77b4", rollback: "#ff7f0e",
  alert: "#d62728", restart: "#d62728", failure: "#d62728" };
const params = new URLSearchParams(location.search);
const token = params.get("token") || "";
const only = (location.hash.match(/only=([\w-]+)/) || [])[1];
if (only) document.body.classList.add("only");
const animation = KEEL.mode === "live" ? { duration: 0 } : false;

const runs = KEEL.runs.map((r, i) => ({ name: r.name, color: COLORS[i % COLORS.length],
  metrics: [], events: [], mNext: 0, eNext: 0, summary: r.summary || {},
  skipped: r.skipped || 0 }));

// Vertical markers at each event's step, on every chart with a step axis.
const eventMarkers = {
  id: "keelEvents",
  afterDatasetsDraw(chart) {
    const x = chart.scales.x, area = chart.chartArea, ctx = chart.ctx;
    ctx.save();
    for (const run of runs) for (const e of run.events) {
      const step = e.step ?? e.spike_step;
      if (step === undefined || e.event === "memory") continue;
      const px = x.getPixelForValue(step);
      if (px < area.left || px > area.right) continue;
      ctx.strokeStyle = EVENT_COLORS[e.event] || "#999";
      ctx.setLineDash([4, 3]);
      ctx.beginPath(); ctx.moveTo(px, area.top); ctx.lineTo(px, area.bottom); ctx.stroke();
    }
    ctx.restore();
  }
};

const charts = {};
function panel(id, title) {
  const div = document.createElement("div");
  div.className = "panel" + (only === id ? " shown" : "");
  div.dataset.chart = id;
  div.innerHTML = `<h2>${title}</h2><canvas id="c_${id}"></canvas>`;
  document.getElementById("grid").appendChild(div);
  return div.querySelector("canvas");
}
function lineChart(id, title, series, opts = {}) {
  const datasets = [];
  runs.forEach((run, i) => series.forEach(s => { const color = s.alt ?
    ALT_COLORS[i % ALT_COLORS.length] : run.color; datasets.push({
    label: (runs.length > 1 ? run.name + " " : "") + s.label, data: [], run: i, key: s.key,
    map: s.map, borderColor: s.dashed ? color + "99" : color, backgroundColor: color,
    borderDash: s.dashed ? [6, 3] : [], pointRadius: s.points ? 3 : 0, showLine: !s.points,
    borderWidth: 1.5, parsing: false, spanGaps: true }); }));
  charts[id] = new Chart(panel(id, title), { type: "line", data: { datasets },
    options: { animation, responsive: true, maintainAspectRatio: false,
      interaction: { mode: "nearest", intersect: false },
      scales: { x: { type: "linear", title: { display: true, text: "step" } },
                y: { type: opts.log ? "logarithmic" : "linear", beginAtZero: !!opts.zero } },
      plugins: { legend: { labels: { boxWidth: 12 } } } },
    plugins: [eventMarkers] });
}
function stackChart(run, i) {
  const id = "breakdown" + (runs.length > 1 ? "-" + i : "");
  const datasets = PHASES.map(([key, label], k) => ({ label, data: [], run: i, key,
    map: m => Math.max(0, m[key] || 0), fill: true, borderWidth: 0, pointRadius: 0,
    backgroundColor: PHASE_COLORS[k], borderColor: PHASE_COLORS[k], parsing: false }));
  charts[id] = new Chart(panel(id, "step time by phase (ms)" + (runs.length > 1 ? ": " +
    run.name : "")), { type: "line", data: { datasets }, options: { animation, responsive: true,
      maintainAspectRatio: false, scales: { x: { type: "linear", title: { display: true,
        text: "step" } }, y: { stacked: true, beginAtZero: true } },
      plugins: { legend: { labels: { boxWidth: 10 } } } }, plugins: [eventMarkers] });
}

lineChart("loss", "loss", [{ label: "train", key: "loss" },
  { label: "validation", key: "val_loss", points: true, alt: true }]);
lineChart("lr", "learning rate", [{ label: "lr", key: "lr" }]);
lineChart("grad_norm", "gradient norm", [{ label: "norm", key: "grad_norm" }]);
lineChart("tokens_per_s", "tokens/s", [{ label: "tokens/s", key: "tokens_per_s" }], { zero: true });
lineChart("mfu", "MFU (%)", [{ label: "MFU", key: "mfu", map: m => 100 * m.mfu }], { zero: true });
lineChart("memory", "resident memory, rank 0 (GiB)", [
  { label: "now", key: "rss_bytes", map: m => (m.rss_bytes || [0])[0] / 2 ** 30 },
  { label: "peak", key: "peak_rss_bytes", dashed: true,
    map: m => (m.peak_rss_bytes || [0])[0] / 2 ** 30 }], { zero: true });
runs.forEach(stackChart);

function addLines(i, metrics, events) {
  const run = runs[i];
  for (const m of metrics) {
    // A resumed or rolled-back run writes its steps again: later lines replace earlier ones.
    while (run.metrics.length && run.metrics[run.metrics.length - 1].step >= m.step)
      run.metrics.pop();
    run.metrics.push(m);
  }
  run.events.push(...events);
  for (const c of Object.values(charts)) for (const ds of c.data.datasets) {
    if (ds.run !== i) continue;
    ds.data = run.metrics.filter(m => ds.map ? true : m[ds.key] !== undefined && m[ds.key] !== null)
      .map(m => ({ x: m.step, y: ds.map ? ds.map(m) : m[ds.key] }));
  }
}

function fmt(v, d = 4) { return v === undefined || v === null ? "-" :
  (typeof v === "number" ? (Math.abs(v) >= 1e5 ? v.toExponential(2) : +v.toPrecision(d)) : v); }
// metrics.jsonl writes a NaN or infinite loss as null.
function finite(v) { return v === null ? "not finite" : v; }
function summary() {
  const rows = [["steps", r => r.metrics.length ? r.metrics[r.metrics.length - 1].step : 0],
    ["tokens", r => r.metrics.reduce((a, m) => a + m.tokens_per_s * m.ms / 1e3, 0)],
    ["training time", r => { const s = r.metrics.reduce((a, m) => a + m.ms, 0) / 1e3;
      return s > 3600 ? (s / 3600).toFixed(2) + " h" : s > 60 ? (s / 60).toFixed(1) + " min" :
        s.toFixed(1) + " s"; }],
    ["goodput", r => r.summary.goodput !== undefined ? (100 * r.summary.goodput).toFixed(1) +
      "%" : "-"],
    ["final train loss", r => r.metrics.length ? finite(r.metrics[r.metrics.length - 1].loss) :
      null],
    ["final validation loss", r => { const v = r.metrics.filter(m => m.val_loss !== undefined);
      return v.length ? finite(v[v.length - 1].val_loss) : null; }],
    ["best validation loss", r => { const v = r.metrics.map(m => m.val_loss)
      .filter(x => typeof x === "number"); return v.length ? Math.min(...v) : null; }],
    ["MFU (median)", r => { const v = r.metrics.map(m => m.mfu).sort((a, b) => a - b);
      return v.length ? (100 * v[v.length >> 1]).toFixed(1) + "%" : "-"; }],
    ["events", r => { const n = {}; for (const e of r.events) if (e.event !== "memory")
      n[e.event] = (n[e.event] || 0) + 1;
      return Object.entries(n).map(([k, v]) => k + " " + v).join(", ") || "-"; }]];
  let html = "<table><tr><th></th>" + runs.map(r =>
    `<th style="color:${r.color}">${r.name.replace(/</g, "&lt;")}</th>`).join("") + "</tr>";
  for (const [label, f] of rows)
    html += `<tr><td>${label}</td>` + runs.map(r => `<td>${fmt(f(r))}</td>`).join("") + "</tr>";
  document.getElementById("summary").innerHTML = html + "</table>";
}

window.keelState = () => ({
  charts: Object.fromEntries(Object.entries(charts).map(([id, c]) =>
    [id, c.data.datasets[0].data.length])),  // each chart's first series: run 0's, or its run's
  lines: runs.map(r => r.metrics.length), events: runs.map(r => r.events.length),
  skipped: runs.map(r => r.skipped), errors });
function render() {
  try {
    for (const c of Object.values(charts)) c.update();
    summary();
    // Lines the server left out (damaged, or over 1 MiB each: not lines keel writes).
    document.getElementById("warnings").textContent = runs.filter(r => r.skipped)
      .map(r => `${r.name}: ${r.skipped} line(s) skipped (not JSON, or over 1 MiB)`).join("; ");
  } catch (err) {
    errors.push(String(err));
  }
  document.getElementById("state").textContent = JSON.stringify(window.keelState());
}

async function poll() {
  for (let i = 0; i < runs.length; i++) {
    const q = (kind, since) => fetch(`api/${kind}?run=${i}&since=${since}` +
      (token ? "&token=" + encodeURIComponent(token) : "")).then(r => {
        if (!r.ok) throw new Error(`api/${kind}: HTTP ${r.status}`); return r.json(); });
    const [m, e] = await Promise.all([q("metrics", runs[i].mNext), q("events", runs[i].eNext)]);
    runs[i].mNext = m.next; runs[i].eNext = e.next;
    // A file rewritten under the page (a resumed or rolled-back run): read again from its start.
    if (m.reset || e.reset) runs[i].skipped = 0;  // counted again as the files are read again
    if (m.reset) runs[i].metrics = [];
    if (e.reset) runs[i].events = [];
    runs[i].skipped += (m.skipped || 0) + (e.skipped || 0);
    addLines(i, m.lines, e.lines);
    if (m.summary) runs[i].summary = m.summary;
  }
  render();
  document.getElementById("status").textContent = "live, updated " +
    new Date().toLocaleTimeString();
}

if (KEEL.mode === "live") {
  const loop = () => poll().catch(err => {
    document.getElementById("status").textContent = "(" + err.message + ")";
  }).finally(() => setTimeout(loop, KEEL.poll_ms || 1000));
  loop();
} else {
  KEEL.runs.forEach((r, i) => addLines(i, r.metrics, r.events));
  render();
}
</script>
</body></html>
)PAGE";

void ReplaceAll(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size())
    s.replace(at, from.size(), to);
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string ScriptSafe(const std::string& text) {
  std::string s = text;
  ReplaceAll(s, "</", "<\\/");
  return s;
}

std::string DashboardHtml(const std::string& title, const std::string& chart_js,
                          const nlohmann::json& config) {
  std::string page = kPage;
  // The placeholders are replaced once each, in an order that keeps inserted text untouched.
  auto put = [&](const std::string& key, const std::string& value) {
    const size_t at = page.find(key);
    if (at != std::string::npos) page.replace(at, key.size(), value);
  };
  put("@@CONFIG@@",
      ScriptSafe(config.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  put("@@CHARTJS@@", chart_js);
  const std::string t = HtmlEscape(title);
  put("@@TITLE@@", t);
  put("@@TITLE@@", t);
  return page;
}

}  // namespace keel::monitor
