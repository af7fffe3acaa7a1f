"""The reports, end to end: HTML opened in a real headless Chromium, Markdown escaping, determinism.

Inputs: the real CPU smoke results (tests/data/smoke_cpu.jsonl) with one cell's model renamed to a
script tag, plus synthetic GPU-shaped records (tests/data/synthetic_gpu.jsonl, host "test-fixture")
so the NVML/allocator columns, MFU and every failure status have data. The baseline is the GPU
fixture with its throughput and memory scaled, so the deltas section renders too.

Without /usr/bin/chromium the browser tests FAIL (CI installs it); set ZEROBENCH_ALLOW_NO_BROWSER=1
to skip them instead on a machine that cannot have one.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from bench.cli import main as cli
from bench.judge.results import latest, load
from bench.report import write_reports
from bench.report.markdown import escape
from tools.browser import BrowserMissing, chromium_path, launch

DATA = Path(__file__).parent.parent / "data"
XSS = "<script>alert(1)</script>"
XSS_REASON_PART = "<img src=x onerror=alert(2)>"  # in the synthetic cuda_oom record's reason


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, list[Path]]:
    d = tmp_path_factory.mktemp("results")
    cpu = _records(DATA / "smoke_cpu.jsonl")
    target = next(r for r in cpu if r["status"] == "ok")["cell_hash"]
    for r in cpu:
        if r["cell_hash"] == target:
            r["cell"]["model"] = XSS
    base = _records(DATA / "synthetic_gpu.jsonl")
    for r in base:  # the baseline was 10% faster (every step 1.1 times shorter) and used 5% less memory
        for k, v in (r.get("metrics") or {}).items():
            if k == "tokens_per_s" and v:
                r["metrics"][k] = v * 1.1
            elif k.startswith("step_time_") and v:
                r["metrics"][k] = v / 1.1
        r["step_times_s"] = [t / 1.1 for t in r.get("step_times_s") or []] or None
        for k, v in (r.get("memory") or {}).items():
            if isinstance(v, (int, float)):
                r["memory"][k] = int(v * 0.95)
    return {
        "results": [_write(d / "smoke_cpu_xss.jsonl", cpu), DATA / "synthetic_gpu.jsonl"],
        "baseline": [_write(d / "baseline.jsonl", base)],
    }


@pytest.fixture(scope="module")
def report(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reports") / "showcase"
    write_reports(inputs["results"], out, baseline=inputs["baseline"])
    return out


@pytest.fixture(scope="module")
def expected_cells(inputs):
    return latest(load(*inputs["results"]))


# -- in the browser ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if chromium_path() is None:
        msg = (
            "headless Chromium not found at /usr/bin/chromium: install Debian's package "
            "(apt-get install -y chromium), or set ZEROBENCH_ALLOW_NO_BROWSER=1 to skip the browser tests"
        )
        if os.environ.get("ZEROBENCH_ALLOW_NO_BROWSER") == "1":
            pytest.skip(msg)
        pytest.fail(msg)
    try:
        with launch() as b:
            yield b
    except BrowserMissing as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def page(browser, report):
    """The report loaded once; everything the page did on the way is recorded in page.log."""
    p = browser.new_page(viewport={"width": 1360, "height": 900})
    log = {"console": [], "errors": [], "requests": [], "dialogs": []}
    p.on("console", lambda m: log["console"].append((m.type, m.text)))
    p.on("pageerror", lambda e: log["errors"].append(str(e)))
    p.on("request", lambda r: log["requests"].append(r.url))
    p.on("dialog", lambda d: (log["dialogs"].append(d.message), d.dismiss()))
    url = report.with_name(report.name + ".html").resolve().as_uri()
    p.goto(url, wait_until="load")
    p.log, p.url_loaded = log, url
    yield p
    p.close()


def test_renders_without_console_errors(page):
    assert page.log["errors"] == []
    assert [m for m in page.log["console"] if m[0] in ("error", "warning")] == []
    assert page.title().startswith("zerobench:")


def test_makes_no_network_requests(page):
    # Only the file itself; a CDN script, a web font or an <img src> from a result would show up here.
    assert [u for u in page.log["requests"] if u != page.url_loaded and not u.startswith("data:")] == []


def test_script_in_a_model_name_is_text(page):
    assert page.log["dialogs"] == [], "a script from the results ran"
    assert page.evaluate("document.scripts.length") == 1, "only the report's own script"
    assert page.evaluate("document.images.length") == 0, "an <img> from a result's reason became an element"
    models = page.locator("#cells-table td.mono").all_inner_texts()
    assert XSS in models
    assert page.get_by_text(XSS_REASON_PART).count() >= 1


def test_all_cells_and_sections_present(page, expected_cells):
    rows = page.locator("#cells-table tbody tr")
    assert rows.count() == len(expected_cells)
    text = page.locator("#cells-table").inner_text()
    for h in expected_cells["cell_hash"]:
        assert f"#{h}" in text
    for section in ("cells", "memory", "loss", "failures", "baseline", "environment"):
        assert page.locator(f"section#{section}").count() == 1, section
    # Three models (the smoke run's llama-tiny, one of its cells renamed, the GPU fixture's llama-1b):
    # a section each, with its own headline cards, chart and MFU table; the CPU smoke's knobs have effects.
    models = page.locator("section.model")
    assert models.count() == expected_cells["model"].nunique() == 3
    for i in range(3):
        m = models.nth(i)
        slug = m.get_attribute("id")
        for part in ("summary", "tradeoff", "compute"):
            assert m.locator(f"section#{slug}-{part}").count() == 1, (slug, part)
    assert page.locator("section.model section.ablations").count() >= 1
    # Failed and skipped cells, each with its reason.
    failed = expected_cells[expected_cells["status"] != "ok"]
    assert page.locator("#failures-table tbody tr").count() == len(failed)
    assert "no progress for 600 s" in page.locator("#failures").inner_text()


def test_charts_present(page, expected_cells):
    models = expected_cells.groupby("model")
    assert page.locator("svg.chart").count() == len(models) + 1  # a scatter per model, the loss curves
    for model, cells in models:
        ok = cells[cells["status"] == "ok"]
        # One point per ok cell of that model, its cell as the tooltip; the frontier's numbered as in the
        # table beside; no other model's cell among them.
        section = page.locator("section.model", has=page.locator("h2", has_text=model)).first
        tips = section.locator(".tradeoff svg g.pt > title").all_text_contents()
        assert len(tips) == section.locator(".tradeoff svg g.pt").count() == len(ok), model
        for name in ok["cell_name"]:
            assert any(name in t for t in tips), name
        frontier = section.locator(".tradeoff svg g.pt.frontier > title").all_text_contents()
        assert len(frontier) >= 1 and all(t.startswith(f"frontier #{i}: ") for i, t in enumerate(frontier, start=1))
        assert section.locator(".tradeoff tbody tr").count() == len(frontier)
    curves = page.locator("#loss svg g.series > title").all_text_contents()
    assert len(curves) >= 2 and len(curves) == page.locator("#loss ul.legend li").count()
    # GPU memory side by side: NVML, allocator reserved, allocator allocated, and the estimate column.
    head = page.locator("#memory thead").inner_text()
    for col in ("NVML process", "allocator reserved", "allocator allocated", "model states"):
        assert col in head
    assert page.locator("#memory .bar").count() > 0
    assert "41.2%" in page.locator("section.model .compute").all_inner_texts()[-1]  # the GPU fixture's best MFU


def test_table_sorts_and_filters(page, expected_cells):
    tps_col = page.locator("#cells-table thead th", has_text="tokens/s")
    tps_col.click()
    tps_col.click()  # descending
    first = page.locator("#cells-table tbody tr").first.inner_text()
    assert expected_cells.loc[expected_cells["tokens_per_s"].idxmax(), "cell_name"] in first
    box = page.locator('[data-filter-for="cells-table"] input')
    box.fill("zero=3 lora")
    visible = page.locator("#cells-table tbody tr:visible")
    want = expected_cells["cell_name"].str.contains("zero=3") & expected_cells["cell_name"].str.contains("lora")
    assert visible.count() == int(want.sum()) > 0
    box.fill("")
    assert page.locator("#cells-table tbody tr:visible").count() == len(expected_cells)


def test_baseline_deltas(page):
    text = page.locator("#baseline").inner_text()
    assert "-9.1%" in text  # tokens/s now vs 10% faster baseline: 1/1.1 - 1
    assert "+5.3%" in text  # memory now vs 5% smaller baseline: 1/0.95 - 1


# -- without a browser -------------------------------------------------------------------------------


def test_html_source_has_no_raw_result_markup(report):
    page = report.with_name(report.name + ".html").read_text()
    assert XSS not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert XSS_REASON_PART not in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page


def test_inline_charts_fit_the_page(report):
    # Two matplotlib SVGs in one page: their ids must not collide, and nothing but the page's own
    # markup may name a URL (no XML prolog, DOCTYPE or RDF metadata; links only to ids in the page).
    page = report.with_name(report.name + ".html").read_text()
    ids = re.findall(r' id="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    assert set(re.findall(r'(?:href="#|url\(#)([^")]+)', page)) <= set(ids)
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page and "<metadata" not in page
    assert page.count("<svg") == 4 and page.count("<style") == 1 and "xlink:" not in page  # 3 models, loss
    assert page.count('<g class="pt') == len(re.findall(r'<g class="pt[^"]*"><title>', page)) > 0


def test_one_chart_description_for_both_reports(inputs):
    # The PNG and the inline SVG draw the same Chart: each model's frontier numbered as the Markdown table
    # numbers it, a tooltip per point, and the HTML loss list coloured as the curves are.
    from bench.report import charts, figures, html
    from bench.report.analysis import analyse

    a = analyse(load(*inputs["results"]))
    built = charts.build(a)
    assert list(built) == [f"tradeoff-{s.slug}" for s in a.sections] + ["loss"]
    for s in a.sections:
        chart = built[f"tradeoff-{s.slug}"]
        frontier = next(x for x in chart.series if x.css == "pt frontier")
        assert frontier.numbers == tuple(range(1, len(s.frontier) + 1))
        svg = figures.svg(chart)
        assert svg.count('<g class="pt frontier"><title>frontier #') == len(s.frontier)
        assert svg.count('<g class="pt"><title>') == sum(len(x.tips) for x in chart.series) - len(s.frontier)
    page = html.render_analysis(a, built)
    for s in built["loss"].series:
        assert f'style="background:{s.color}"' in page


def test_reports_are_deterministic(inputs, tmp_path):
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name / "r"
        written = write_reports(inputs["results"], out, baseline=inputs["baseline"])
        outs.append({p.name: p.read_bytes() for p in written})
    charts = [f"r.tradeoff-{m}.png" for m in ("llama-1b-seq1024", "llama-tiny-seq64", "script-alert-1-script-seq64")]
    assert sorted(outs[0]) == sorted(outs[1]) == sorted(["r.html", "r.loss.png", "r.md", *charts])
    for name in outs[0]:
        assert outs[0][name] == outs[1][name], f"{name} differs between two renders of the same results"


def test_markdown_escapes_and_links_its_charts(report):
    md_path = report.with_name(report.name + ".md")
    md = md_path.read_text()
    assert "<script" not in md and "<img" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md  # the model name, shown as text
    assert "&lt;img src=x onerror=alert(2)&gt;" in md  # the OOM reason, shown as text
    for chart in (
        "showcase.tradeoff-llama-tiny-seq64.png",
        "showcase.tradeoff-llama-1b-seq1024.png",
        "showcase.loss.png",
    ):
        assert f"]({chart})" in md and (md_path.parent / chart).exists()
    headings = ("## llama-tiny, sequence length 64", "### Best cells", "### What failed", "### What fits", "## Not run")
    for heading in headings:
        assert heading in md
    assert "## Against the baseline" in md


def test_markdown_escape_neutralises_table_syntax():
    assert escape("a|b\nc") == r"a\|b c"
    assert escape("<b>x_y</b>") == r"&lt;b&gt;x\_y&lt;/b&gt;"
    assert escape("[link](http://x)") == r"\[link\](http://x)"
    assert escape(None) == ""


def test_empty_results_render(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    written = write_reports([empty], tmp_path / "empty")
    assert "No results." in (tmp_path / "empty.md").read_text()
    assert "No results." in (tmp_path / "empty.html").read_text()
    assert {p.suffix for p in written} == {".md", ".html"}


def test_cli_report_exports(inputs, tmp_path, capsys):
    out, csv = tmp_path / "r", tmp_path / "t.csv"
    assert (
        cli(
            [
                "report",
                *map(str, inputs["results"]),
                "-o",
                str(out),
                "--csv",
                str(csv),
                "--baseline",
                str(inputs["baseline"][0]),
            ]
        )
        == 0
    )
    header = csv.read_text().splitlines()[0].split(",")
    for col in ("cell_hash", "status", "tokens_per_s", "peak_memory_bytes", "nvml_proc_peak_bytes", "started_at"):
        assert col in header
    pq = tmp_path / "t.parquet"
    rc = cli(["report", str(inputs["results"][0]), "-o", str(out), "--parquet", str(pq)])
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        assert rc == 2 and not pq.exists()
        assert "needs pyarrow" in capsys.readouterr().err
    else:
        import pandas as pd

        assert rc == 0 and len(pd.read_parquet(pq)) == len(load(inputs["results"][0]))
