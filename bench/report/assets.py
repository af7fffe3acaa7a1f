"""The HTML report's stylesheet and script, inlined into the page so it opens offline.

Kept as Python strings (not package data files) so they ship with the package whatever installs it.
No web fonts: a system font stack, so nothing is fetched and the page still reads well everywhere.
"""

CSS = """
:root {
  --fg: #1c2230; --muted: #5d6677; --line: #e2e5eb; --panel: #f6f7f9; --accent: #2f63c8;
  --ok: #2e7d32; --warn: #b45f06; --bad: #c0392b; --skip: #6b7280; --front: #d9480f;
  --font: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", "Liberation Sans", "DejaVu Sans", Arial,
    sans-serif;
  --mono: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", "DejaVu Sans Mono", monospace;
}
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.5 var(--font); color: var(--fg); background: #fff; }
header { padding: 22px 32px 14px; background: var(--panel); border-bottom: 1px solid var(--line); }
header h1 { font-size: 22px; margin: 0 0 4px; font-weight: 650; }
header .sub { margin: 0 0 10px; color: var(--muted); }
nav a { color: var(--accent); text-decoration: none; margin-right: 14px; font-size: 13px; white-space: nowrap; }
nav a:hover { text-decoration: underline; }
main { max-width: 1320px; margin: 0 auto; padding: 4px 32px 40px; }
section { margin-top: 28px; }
h2 { font-size: 18px; margin: 0 0 6px; padding-top: 14px; border-top: 1px solid var(--line); font-weight: 650; }
h3 { font-size: 15px; margin: 20px 0 4px; font-weight: 650; }
p.note { color: var(--muted); margin: 2px 0 10px; max-width: 90ch; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(250px, 1fr)); gap: 12px; margin-top: 12px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 22px; font-weight: 650; font-variant-numeric: tabular-nums; }
.card .v small { font-size: 13px; font-weight: 500; color: var(--muted); }
.card .d { font-size: 12px; color: var(--muted); }
.cell, .mono { font-family: var(--mono); font-size: 12px; overflow-wrap: break-word; }
td.cell { min-width: 22ch; }
.nowrap { white-space: nowrap; }
.hash { color: var(--muted); }
.tag { display: inline-block; font: 600 11px var(--font); color: var(--front); border: 1px solid var(--front);
       border-radius: 9px; padding: 0 6px; margin-left: 4px; white-space: nowrap; }
.st { display: inline-block; padding: 0 8px; border-radius: 9px; font: 600 12px/18px var(--font); color: #fff;
      background: var(--skip); white-space: nowrap; }
.st-ok { background: var(--ok); }
.st-cuda_oom, .st-host_oom { background: var(--warn); }
.st-error, .st-diverged { background: var(--bad); }
.st-timeout { background: #7b3fa0; }
.table-wrap { max-height: 620px; overflow: auto; border: 1px solid var(--line); border-radius: 6px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { padding: 5px 9px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
thead th { position: sticky; top: 0; z-index: 1; background: var(--panel); font-weight: 600; white-space: nowrap;
           box-shadow: inset 0 -1px 0 var(--line); }
table.wrap-head thead th { white-space: normal; min-width: 8ch; }
th.n, td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafbfc; }
tbody tr:hover { background: #eef3fd; }
th.sortable-h { cursor: pointer; user-select: none; }
th.sortable-h:hover { color: var(--accent); }
th[aria-sort=ascending]::after { content: " \\25B2"; font-size: 10px; }
th[aria-sort=descending]::after { content: " \\25BC"; font-size: 10px; }
.controls { display: flex; gap: 10px; align-items: center; margin: 8px 0; flex-wrap: wrap; }
.controls input, .controls select { font: inherit; padding: 4px 8px; border: 1px solid #c8cdd6; border-radius: 6px; }
.controls input { width: 340px; max-width: 100%; }
.count { color: var(--muted); font-size: 13px; }
.muted { color: var(--muted); }
.good { color: var(--ok); }
.bad { color: var(--bad); }
figure { margin: 8px 0; }
.row { display: flex; gap: 20px; align-items: flex-start; flex-wrap: wrap; }
.row > figure { flex: 0 1 760px; min-width: 0; }
.row > .side { flex: 1 1 340px; min-width: 0; margin-top: 8px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; max-width: 90ch; }
svg.chart { max-width: 100%; height: auto; display: block; border: 1px solid var(--line); border-radius: 8px; }
svg.chart text { font-family: var(--font); font-size: 12px; fill: var(--fg); }
svg.chart .tick { fill: var(--muted); font-size: 11px; }
svg.chart .label { font-weight: 600; font-size: 12.5px; }
svg.chart .grid { stroke: #edf0f3; }
svg.chart .axis { stroke: #98a1b0; }
svg.chart .pt { fill: var(--accent); fill-opacity: .5; }
svg.chart .pt.frontier { fill: var(--front); fill-opacity: 1; stroke: #fff; stroke-width: 1.5; }
svg.chart .frontier-line { fill: none; stroke: var(--front); stroke-width: 1.5; stroke-dasharray: 5 4; }
svg.chart .series polyline { fill: none; stroke-width: 2; stroke-linejoin: round; }
svg.chart .series:hover polyline { stroke-width: 3.5; }
svg.chart .shade { fill: #f3f4f7; }
svg.chart .shade-label { fill: var(--muted); font-size: 11px; }
ul.legend { list-style: none; padding: 0; font-size: 12px; }
ul.legend li { display: flex; gap: 8px; margin-bottom: 5px; }
ul.legend .swatch { flex: none; margin: 7px 0 0; }
ul.legend .muted { white-space: nowrap; }
.swatch { display: inline-block; width: 16px; height: 4px; border-radius: 2px; vertical-align: middle;
          margin-right: 6px; }
.bars { display: flex; flex-direction: column; gap: 2px; min-width: 200px; padding-top: 3px; }
.bar { height: 6px; border-radius: 2px; }
.bar.s0 { background: #2f63c8; }
.bar.s1 { background: #f28e2b; }
.bar.s2 { background: #76b7b2; }
.bar.s3 { background: #9c755f; }
.key { display: inline-flex; align-items: center; margin-right: 14px; font-size: 12px; }
.key .bar { width: 16px; margin-right: 6px; }
td.ab { min-width: 120px; }
td.ab .r { color: var(--muted); font-size: 11.5px; }
.effects { margin: 2px 0 8px; padding: 0; list-style: none; font-size: 13px; }
.reason { white-space: pre-wrap; overflow-wrap: break-word; font-family: var(--mono); font-size: 12px; margin: 0;
          max-width: 90ch; }
details summary { cursor: pointer; }
dl.env { display: grid; grid-template-columns: max-content 1fr; gap: 3px 18px; margin: 8px 0; }
dl.env dt { color: var(--muted); }
dl.env dd { margin: 0; font-family: var(--mono); font-size: 12px; overflow-wrap: break-word; }
footer { max-width: 1320px; margin: 0 auto; padding: 12px 32px 32px; color: var(--muted); font-size: 12px; }
"""

# Sortable, filterable tables in vanilla JS. Numbers sort by their data-v attribute (raw values, not
# the formatted text); empty values sort last in both directions; ties keep the report's order.
JS = """
"use strict";
function cellKey(td) {
  if (!td) return null;
  if ("v" in td.dataset) return td.dataset.v === "" ? null : Number(td.dataset.v);
  const t = td.textContent.trim().toLowerCase();
  return t === "" ? null : t;
}
function sortTable(table, col, th) {
  const asc = th.getAttribute("aria-sort") !== "ascending";
  for (const h of table.tHead.rows[0].cells) h.removeAttribute("aria-sort");
  th.setAttribute("aria-sort", asc ? "ascending" : "descending");
  const body = table.tBodies[0];
  const keyed = Array.from(body.rows, (r, i) => [cellKey(r.cells[col]), i, r]);
  keyed.sort((a, b) => {
    if (a[0] === null || b[0] === null) return (a[0] === null) - (b[0] === null) || a[1] - b[1];
    const c = (typeof a[0] === "number" && typeof b[0] === "number") ? a[0] - b[0]
      : String(a[0]).localeCompare(String(b[0]), undefined, {numeric: true});
    return (asc ? c : -c) || a[1] - b[1];
  });
  const frag = document.createDocumentFragment();
  for (const k of keyed) frag.appendChild(k[2]);
  body.appendChild(frag);
}
for (const table of document.querySelectorAll("table.sortable")) {
  Array.from(table.tHead.rows[0].cells).forEach((th, col) => {
    th.classList.add("sortable-h");
    th.tabIndex = 0;
    th.title = "sort";
    const go = () => sortTable(table, col, th);
    th.addEventListener("click", go);
    th.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); go(); } });
  });
}
for (const box of document.querySelectorAll("[data-filter-for]")) {
  const table = document.getElementById(box.dataset.filterFor);
  const text = box.querySelector("input");
  const status = box.querySelector("select");
  const count = box.querySelector(".count");
  const rows = Array.from(table.tBodies[0].rows);
  const texts = rows.map((r) => r.textContent.toLowerCase());
  const apply = () => {
    const words = text.value.toLowerCase().split(/\\s+/).filter(Boolean);
    const st = status ? status.value : "";
    let shown = 0;
    rows.forEach((r, i) => {
      const keep = (!st || r.dataset.status === st) && words.every((w) => texts[i].includes(w));
      r.hidden = !keep;
      shown += keep ? 1 : 0;
    });
    count.textContent = shown + " of " + rows.length + " rows";
  };
  text.addEventListener("input", apply);
  if (status) status.addEventListener("change", apply);
  apply();
}
"""
