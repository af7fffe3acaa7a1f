"""The HTML report's Jinja2 template (autoescaped: every value is text unless marked as markup).

Variables come from `html.render_analysis`: `a` (the Analysis) plus one small dict per section.
Numeric cells carry their raw value in data-v, so the table script sorts numbers, not their text.
"""

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{ csp }}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{{ a.title }}</title>
<style>{{ css }}</style>
</head>
<body>
{%- macro td_num(value, text) %}<td class="n" data-v="{{ value|sv }}">{{ text }}</td>{% endmacro %}
{%- macro pill(status, title="") %}<span class="st st-{{ status }}"{% if title %} title="{{ title }}"{% endif %}>
{{- status }}</span>{% endmacro %}
{%- macro reason(text) %}{% set head = clip(text) %}
  {%- if head != text %}<details><summary class="reason">{{ head }}…</summary>
    <p class="reason">{{ text }}</p></details>
  {%- else %}<p class="reason">{{ text }}</p>{% endif %}
{%- endmacro %}
{%- macro filter_box(table_id, placeholder, statuses) %}
<div class="controls" data-filter-for="{{ table_id }}">
  <input type="search" placeholder="{{ placeholder }}" aria-label="filter rows">
  <select aria-label="status"><option value="">any status</option>
    {%- for s in statuses %}<option value="{{ s }}">{{ s }}</option>{% endfor %}</select>
  <span class="count"></span>
</div>
{%- endmacro %}
<header>
<h1>{{ a.title }}</h1>
<p class="sub">{{ n_cells }} cell{{ "s" if n_cells != 1 }}, {{ a.attempts }} attempt{{ "s" if a.attempts != 1 }}
{%- for s, n in a.counts.items() %} &nbsp;<span class="st st-{{ s }}">{{ n }} {{ s }}</span>{% endfor %}</p>
<nav>{% for id, title in nav %}<a href="#{{ id }}">{{ title }}</a>{% endfor %}</nav>
</header>
<main>
{%- if not n_cells %}
<section><p class="note">No results.</p></section>
{%- else %}

<section id="summary">
<div class="cards">
  {%- if a.fastest %}
  <div class="card"><div class="k">Fastest ok cell</div>
    <div class="v">{{ a.fastest.tokens_per_s|num }} <small>tokens/s</small></div>
    <div class="cell">{{ a.fastest.cell_name|name }}</div>
    <div class="d">{{ a.fastest.peak_memory_bytes|gib }} GiB {{ a.peak_label }}</div></div>
  {%- endif %}
  {%- if a.smallest %}
  <div class="card"><div class="k">Lowest-memory ok cell</div>
    <div class="v">{{ a.smallest.peak_memory_bytes|gib }} <small>GiB</small></div>
    <div class="cell">{{ a.smallest.cell_name|name }}</div>
    <div class="d">{{ a.smallest.tokens_per_s|num }} tokens/s</div></div>
  {%- endif %}
  {%- if a.best_mfu %}
  <div class="card"><div class="k">Best MFU</div>
    <div class="v">{{ a.best_mfu.mfu|pct }}</div>
    <div class="cell">{{ a.best_mfu.cell_name|name }}</div>
    <div class="d">HFU {{ a.best_mfu.hfu|pct }}, {{ a.best_mfu.tflops_per_gpu|tflops }} TFLOP/s per GPU</div></div>
  {%- endif %}
  <div class="card"><div class="k">What fits</div>
    <div class="v">{{ fits.ok }} <small>ok of {{ fits.ran }} cells that ran</small></div>
    <div class="d">{{ fits.text }}</div></div>
</div>
</section>

{%- if scatter %}
<section id="tradeoff">
<h2>Throughput vs peak memory</h2>
<p class="note">Each ok cell once. The Pareto frontier joins the cells that no other cell beats on both
throughput and memory: pick from it for a memory budget.</p>
<div class="row">
<figure>{{ scatter }}<figcaption>{{ scatter_note }}</figcaption></figure>
<div class="side table-wrap"><table class="sortable">
<thead><tr><th>frontier cell</th><th class="n">peak (GiB)</th><th class="n">tokens/s</th></tr></thead>
<tbody>
{%- for r in frontier %}
<tr><td class="cell">{{ r.cell_name|name }}</td>{{ td_num(r.peak_memory_bytes, r.peak_memory_bytes|gib) }}
{{- td_num(r.tokens_per_s, r.tokens_per_s|num) }}</tr>
{%- endfor %}
</tbody></table></div>
</div>
</section>
{%- endif %}

<section id="cells">
<h2>All cells</h2>
<p class="note">The last attempt of each cell. Click a header to sort; type to filter (every word must match).
Peak memory is {{ a.peak_label }}.</p>
{{ filter_box("cells-table", "filter, e.g. zero=3 lora", a.counts) }}
<div class="table-wrap"><table class="sortable" id="cells-table">
<thead><tr><th>cell</th><th>status</th><th>model</th>
  {%- for c, head in extra_cols %}<th class="n">{{ head }}</th>{% endfor %}
  <th class="n">tokens/s</th><th class="n">step, median (ms)</th><th class="n">peak memory (GiB)</th>
  {%- if mixed_sources %}<th>measured by</th>{% endif %}
  <th class="n">{{ compute_header }}</th><th class="n">final loss</th><th class="n">wall (s)</th></tr></thead>
<tbody>
{%- for r in rows %}
<tr data-status="{{ r.status }}"><td class="cell">{{ r.cell_name|name }} <span class="hash">#{{ r.cell_hash }}</span>
  {%- if r.pareto %}<span class="tag">frontier</span>{% endif %}</td>
<td>{{ pill(r.status, r.reason) }}</td><td class="mono nowrap">{{ r.model|text }}</td>
{%- for c, head in extra_cols %}{{ td_num(r[c], r[c]|num) }}{% endfor %}
{{ td_num(r.tokens_per_s, r.tokens_per_s|num) }}{{ td_num(r.step_time_median_s, r.step_time_median_s|ms) }}
{{- td_num(r.peak_memory_bytes, r.peak_memory_bytes|gib) }}
{%- if mixed_sources %}<td class="muted">{{ sources.get(r.peak_memory_source, "") }}</td>{% endif %}
{%- if compute %}{{ td_num(r[compute], compute_fmt(r[compute])) }}{% else %}<td></td>{% endif %}
{{- td_num(r.loss_final, r.loss_final|num(3)) }}{{ td_num(r.wall_s, r.wall_s|num(1)) }}</tr>
{%- endfor %}
</tbody></table></div>
</section>

{%- if a.ablations %}
<section id="ablations">
<h2>Ablations: one knob at a time</h2>
<p class="note">For each knob, cells that differ only in it, side by side: throughput and {{ a.peak_label }} per
value, with the ratio to the row's first value. The summary line is the median ratio over all such groups.</p>
{%- for ab in a.ablations %}
<h3>{{ ab.title }}</h3>
<ul class="effects">
  {%- for e in ab.effects %}
  <li><b>{{ value(ab.axis, e.value) }}</b> vs {{ value(ab.axis, e.reference) }}:
    {% if e.n %}{{ e.tokens_ratio|ratio }} tokens/s, {{ e.memory_ratio|ratio }} peak memory
    <span class="muted">(median of {{ e.n }} group{{ "s" if e.n != 1 }})</span>
    {%- else %}<span class="muted">no group where both ran ok</span>{% endif %}</li>
  {%- endfor %}
</ul>
<div class="table-wrap"><table>
<thead><tr><th>the other settings</th>
  {%- for v in ab.values %}<th class="n">{{ value(ab.axis, v) }}</th>{% endfor %}</tr></thead>
<tbody>
{%- for g in ab.groups %}{% set ref = g.cells[ab.values[0]|string] %}
<tr><td class="cell">{{ g.context }}</td>
  {%- for v in ab.values %}{% set c = g.cells[v|string] %}
  {%- set vs_ref = ref and ref.status == "ok" and not loop.first %}
  <td class="n ab">
    {%- if c is none %}<span class="muted">–</span>
    {%- elif c.status == "ok" %}<b>{{ c.tokens_per_s|num }}</b> tok/s
      {%- if vs_ref %} <span class="r">{{ rel(c.tokens_per_s, ref.tokens_per_s)|ratio }}</span>{% endif %}<br>
      {{- c.peak_memory_bytes|gib }} GiB
      {%- if vs_ref %} <span class="r">{{ rel(c.peak_memory_bytes, ref.peak_memory_bytes)|ratio }}</span>{% endif %}
    {%- else %}{{ pill(c.status, c.reason) }}{% endif %}</td>
  {%- endfor %}</tr>
{%- endfor %}
</tbody></table></div>
{%- if ab.n_groups > ab.groups|length %}
<p class="note">{{ ab.groups|length }} of {{ ab.n_groups }} groups shown; the summary uses all.</p>
{%- endif %}
{%- endfor %}
</section>
{%- endif %}

{%- if zero_rows %}
<section id="zero">
<h2>ZeRO stages against the paper</h2>
<p class="note">{{ zero_note }}</p>
<div class="table-wrap"><table class="sortable wrap-head">
<thead><tr><th>cell</th><th class="n">ZeRO</th><th class="n">GPUs</th>
  {%- for col, head in zero_figures %}<th class="n">{{ head }}</th><th class="n">× ZeRO-0</th>{% endfor %}
  <th class="n">model states, ZeRO paper</th><th class="n">× ZeRO-0</th></tr></thead>
<tbody>
{%- for r in zero_rows %}
<tr><td class="cell">{{ r.cell_name|name }}</td>{{ td_num(r.zero_stage, r.zero_stage) }}{{ td_num(r.gpus, r.gpus) }}
{%- for col, head in zero_figures %}{{ td_num(r[col], r[col]|gib) }}{{ td_num(r[col ~ "_ratio"], r[col ~ "_ratio"]|num(3)) }}{% endfor %}
{{- td_num(r.estimate_bytes, r.estimate_bytes|gib) }}{{ td_num(r.predicted_ratio, r.predicted_ratio|num(3)) }}</tr>
{%- endfor %}
</tbody></table></div>
</section>
{%- endif %}

{%- if memory_rows %}
<section id="memory">
<h2>Peak memory per cell</h2>
<p class="note">Peaks in GiB. {{ memory_note }}</p>
<div>{% for col, head in bar_cols %}<span class="key"><span class="bar s{{ loop.index0 }}"></span>{{ head }}</span>
{%- endfor %}</div>
<div class="table-wrap"><table class="sortable wrap-head">
<thead><tr><th>cell</th><th>status</th>
  {%- for col, head, bar in a.memory_columns %}<th class="n">{{ head }}</th>{% endfor %}
  {%- if a.memory_phases %}<th class="n">{{ a.memory_phases[2] }}: setup → steps</th>{% endif %}
  <th>side by side</th></tr></thead>
<tbody>
{%- for r in memory_rows %}
<tr><td class="cell">{{ r.cell_name|name }}</td><td>{{ pill(r.status) }}</td>
{%- for col, head, bar in a.memory_columns %}{{ td_num(r[col], r[col]|gib) }}{% endfor %}
{%- if a.memory_phases %}{% set setup, steps = r[a.memory_phases[0]], r[a.memory_phases[1]] %}
{{- td_num(steps, (setup|gib) ~ " → " ~ (steps|gib)) }}{% endif %}
<td><div class="bars">{% for w in r._bars %}<div class="bar s{{ loop.index0 }}" style="width:{{ w }}%"></div>
{%- endfor %}</div></td></tr>
{%- endfor %}
</tbody></table></div>
</section>
{%- endif %}

{%- if loss_chart %}
<section id="loss">
<h2>Loss curves</h2>
<p class="note">{{ loss_note }}</p>
<div class="row">
<figure>{{ loss_chart }}</figure>
<ul class="side legend">
{%- for r in loss_legend %}
  <li><span class="swatch" style="background:{{ r.color }}"></span><span><span class="cell">{{ r.cell_name|name }}</span>
  {%- if r.loss_final|num(3) %} <span class="muted">final {{ r.loss_final|num(3) }}</span>{% endif %}
  {%- if r.status != "ok" %} {{ pill(r.status) }}{% endif %}</span></li>
{%- endfor %}
</ul>
</div>
</section>
{%- endif %}

<section id="compute">
<h2>{{ "Model FLOPs utilisation" if a.compute_metric == "mfu" else "Achieved compute" }}</h2>
{%- if compute_rows %}
<p class="note">{{ compute_note }}</p>
<div class="table-wrap"><table class="sortable">
<thead><tr><th>cell</th>{% if a.compute_metric == "mfu" %}<th class="n">MFU</th><th class="n">HFU</th>{% endif %}
  <th class="n">TFLOP/s per GPU</th><th></th></tr></thead>
<tbody>
{%- for r in compute_rows %}
<tr><td class="cell">{{ r.cell_name|name }}</td>
  {%- if a.compute_metric == "mfu" %}{{ td_num(r.mfu, r.mfu|pct) }}{{ td_num(r.hfu, r.hfu|pct) }}{% endif %}
  {{- td_num(r.tflops_per_gpu, r.tflops_per_gpu|tflops) }}
  <td><div class="bars"><div class="bar s0" style="width:{{ r._bar }}%"></div></div></td></tr>
{%- endfor %}
</tbody></table></div>
{%- else %}
<p class="note">No cell ran ok with a throughput figure.</p>
{%- endif %}
</section>

<section id="failures">
<h2>Failed and skipped cells</h2>
{%- if not failures %}
<p class="note">None: every cell ran ok.</p>
{%- else %}
<h3>By reason</h3>
<div class="table-wrap"><table>
<thead><tr><th>status</th><th class="n">cells</th><th>reason</th><th>which</th></tr></thead>
<tbody>
{%- for g in a.failure_groups[:max_reasons] %}
<tr><td>{{ pill(g.status) }}</td><td class="n">{{ g.n }}</td><td>{{ reason(g.reason or "(no reason recorded)") }}</td>
  <td class="cell">{% for c in g.cells[:5] %}{{ c|name }}<br>{% endfor %}
  {%- if g.n > 5 %}<span class="muted">and {{ g.n - 5 }} more</span>{% endif %}</td></tr>
{%- endfor %}
</tbody></table></div>
{%- if a.failure_groups|length > max_reasons %}
<p class="note">The {{ max_reasons }} most common of {{ a.failure_groups|length }} distinct reasons; every cell is
below.</p>
{%- endif %}
<h3>Each cell</h3>
{{ filter_box("failures-table", "filter, e.g. fp16", failure_statuses) }}
<div class="table-wrap"><table class="sortable" id="failures-table">
<thead><tr><th>cell</th><th>status</th><th>phase</th><th class="n">exit code</th><th>reason</th></tr></thead>
<tbody>
{%- for r in failures %}
<tr data-status="{{ r.status }}">
  <td class="cell">{{ r.cell_name|name }} <span class="hash">#{{ r.cell_hash }}</span></td><td>{{ pill(r.status) }}</td>
  <td>{{ r.phase_at_end|text }}</td>{{ td_num(r.exit_code, r.exit_code|num) }}<td>{{ reason(r.reason) }}</td></tr>
{%- endfor %}
</tbody></table></div>
{%- endif %}
</section>

{%- if a.baseline is not none %}
<section id="baseline">
<h2>Against the baseline</h2>
<p class="note">Cells matched by cell hash (same configuration). Relative change of this run vs the baseline;
green is better (more tokens/s, less memory), red worse, beyond ±{{ noise }} noise.
{%- if a.baseline_only %} {{ a.baseline_only|length }} baseline cell{{ "s" if a.baseline_only|length != 1 }}
not in these results.{% endif %}</p>
{%- if baseline_rows %}
<div class="table-wrap"><table class="sortable">
<thead><tr><th>cell</th><th>baseline</th><th>now</th>
  <th class="n">tokens/s, baseline</th><th class="n">tokens/s, now</th><th class="n">change</th>
  <th class="n">peak GiB, baseline</th><th class="n">peak GiB, now</th><th class="n">change</th></tr></thead>
<tbody>
{%- for r in baseline_rows %}
<tr><td class="cell">{{ r.cell_name|name }}</td><td>{{ pill(r.status_base) }}</td><td>{{ pill(r.status) }}</td>
  {{- td_num(r.tokens_per_s_base, r.tokens_per_s_base|num) }}{{ td_num(r.tokens_per_s, r.tokens_per_s|num) }}
  <td class="n {{ tone(r.tokens_per_s_change, 1) }}" data-v="{{ r.tokens_per_s_change|sv }}">
  {{- r.tokens_per_s_change|change }}</td>
  {{- td_num(r.peak_memory_bytes_base, r.peak_memory_bytes_base|gib) }}
  {{- td_num(r.peak_memory_bytes, r.peak_memory_bytes|gib) }}
  <td class="n {{ tone(r.peak_memory_change, -1) }}" data-v="{{ r.peak_memory_change|sv }}">
  {{- r.peak_memory_change|change }}</td></tr>
{%- endfor %}
</tbody></table></div>
{%- else %}
<p class="note">No cell of these results is in the baseline.</p>
{%- endif %}
</section>
{%- endif %}

<section id="environment">
<h2>Environment and provenance</h2>
<dl class="env">{% for k, v in a.environment %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl>
</section>
{%- endif %}
</main>
<footer>Written by zerobench from the results alone: the same results give the same file.</footer>
<script>{{ js }}</script>
</body>
</html>
"""
