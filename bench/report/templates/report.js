// Sortable, filterable tables in vanilla JS, inlined into the page (allowed by its hash in the CSP).
// Numbers sort by their data-v attribute (raw values, not the formatted text); empty values sort last
// in both directions; ties keep the report's order.
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
    const words = text.value.toLowerCase().split(/\s+/).filter(Boolean);
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
