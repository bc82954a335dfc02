"""The page's own script and style, served from the package (never from a CDN: GPU boxes
are often offline). The script only polls JSON and swaps text: no framework."""

from __future__ import annotations

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2em 2em; color: #212529; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
a { color: #1c64d6; text-decoration: none; } a:hover { text-decoration: underline; }
table { border-collapse: collapse; } th, td { padding: 3px 10px; text-align: left; }
th { border-bottom: 1px solid #ced4da; font-weight: 600; }
tr:nth-child(even) td { background: #f8f9fa; }
.phase { font-weight: 600; } .running { color: #2b8a3e; } .failed, .lost { color: #c92a2a; }
.stopping, .queued, .starting { color: #e67700; } .stopped, .exited { color: #495057; }
.bar { display: inline-block; width: 120px; height: 9px; background: #e9ecef;
       border-radius: 4px; vertical-align: middle; margin-right: 6px; }
.bar > span { display: block; height: 100%; background: #2f6fdf; border-radius: 4px; }
.last { font-family: ui-monospace, monospace; font-size: 12px; color: #495057;
        max-width: 48em; overflow: hidden; white-space: nowrap; text-overflow: ellipsis; }
pre { background: #f8f9fa; border: 1px solid #e9ecef; padding: 8px; overflow: auto;
      font-size: 12px; }
#log { height: 22em; }
svg.chart { width: 100%; max-width: 760px; height: auto; display: block; margin: 6px 0; }
svg .title { font-weight: 600; font-size: 12px; } svg .tick, svg .legend { font-size: 10px; }
svg .grid { stroke: #e9ecef; } svg .empty { fill: #868e96; font-size: 12px; }
svg .marker { stroke: #adb5bd; stroke-dasharray: 2 3; } svg .checkpoint { stroke: #2b8a3e; }
svg .restart, svg .deploy { stroke: #c92a2a; } svg .cap { stroke: #c92a2a; stroke-dasharray: 5 4; }
svg .hover { fill: transparent; } svg .hover:hover { fill: #495057; }
.timeline td.at { text-align: right; font-family: ui-monospace, monospace; }
.kind-signal { color: #1c64d6; } .kind-kill { color: #c92a2a; font-weight: 600; }
.kind-exit { color: #2b8a3e; } .kind-gpu { color: #7048e8; } .kind-verdict { font-weight: 600; }
button { margin-right: 8px; } .note { color: #868e96; }
"""

JS = """
"use strict";
const token = document.querySelector('meta[name="trainctl-token"]').content;
const page = document.body.dataset.page;
const job = document.body.dataset.job;

async function getJSON(url) {
  const r = await fetch(url, {credentials: "same-origin", cache: "no-store"});
  if (!r.ok) throw new Error(url + ": " + r.status);
  return r.json();
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function bar(pct) {
  const td = document.createElement("td");
  if (pct !== null) {
    const b = document.createElement("span"); b.className = "bar";
    const f = document.createElement("span"); f.style.width = Math.min(100, pct) + "%";
    b.appendChild(f); td.appendChild(b);
  }
  return td;
}

async function refreshJobs() {
  const rows = await getJSON("/api/jobs");
  const body = document.getElementById("jobs");
  body.replaceChildren(...rows.map(j => {
    const tr = document.createElement("tr");
    const a = document.createElement("a"); a.href = "/jobs/" + encodeURIComponent(j.name);
    a.textContent = j.name;
    const name = document.createElement("td"); name.appendChild(a); tr.appendChild(name);
    tr.appendChild(cell(j.state, "phase " + j.state));
    tr.appendChild(cell(String(j.run)));
    const p = bar(j.pct); p.appendChild(document.createTextNode(j.progress || ""));
    tr.appendChild(p);
    tr.appendChild(cell(j.eta || ""));
    tr.appendChild(cell(j.gpus || ""));
    tr.appendChild(cell(j.last || "", "last"));
    return tr;
  }));
}

let logOffset = null;
async function refreshLog() {
  const q = logOffset === null ? "" : "?offset=" + logOffset;
  const t = await getJSON("/api/jobs/" + encodeURIComponent(job) + "/log" + q);
  const pre = document.getElementById("log");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  if (logOffset === null || t.offset < logOffset) pre.textContent = "";
  const old = document.getElementById("log-partial");
  if (old) old.remove();  // the unfinished line: redrawn below, or ended among t.lines
  for (const line of t.lines) {
    const div = document.createElement("div"); div.className = "line";
    div.textContent = line; pre.appendChild(div);
  }
  if (t.partial) {
    const div = document.createElement("div"); div.className = "line"; div.id = "log-partial";
    div.textContent = t.partial; pre.appendChild(div);
  }
  while (pre.childElementCount > 2000) pre.removeChild(pre.firstChild);
  logOffset = t.offset;
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

async function refreshStatus() {
  const s = await getJSON("/api/jobs/" + encodeURIComponent(job));
  const el = document.getElementById("phase");
  el.textContent = s.state; el.className = "phase " + s.state;
}

async function refreshCharts() {
  const r = await fetch("/jobs/" + encodeURIComponent(job) + "/charts",
                        {credentials: "same-origin", cache: "no-store"});
  if (r.ok) document.getElementById("charts").innerHTML = await r.text();
}

async function act(button) {
  const what = button.dataset.action;
  if (!confirm(what + " " + job + "?")) return;
  const out = document.getElementById("action-result");
  out.textContent = what + " ...";
  const r = await fetch("/api/jobs/" + encodeURIComponent(job) + "/" + what, {
    method: "POST", credentials: "same-origin", headers: {"X-Trainctl-Token": token}});
  const doc = await r.json();
  out.textContent = doc.ok ? what + ": done (exit " + doc.exit_code + ")"
                           : what + " refused: " + doc.error;
  // what the action changed, at once: the status, the charts, the stop timeline
  if (doc.ok) setTimeout(() => location.reload(), 800);
}

function every(ms, f) { const run = () => f().catch(() => {}); run(); setInterval(run, ms); }

if (page === "jobs") every(2000, refreshJobs);
if (page === "job") {
  every(1000, refreshLog);
  every(2000, refreshStatus);
  setInterval(() => refreshCharts().catch(() => {}), 10000);
  document.querySelectorAll("button[data-action]").forEach(
    b => b.addEventListener("click", () => act(b)));
}
"""
