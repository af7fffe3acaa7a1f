"""The user docs: generated pages match what generates them, every matrix key and results file is
described, links resolve, and the product speaks of itself rather than of how it was built."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tools import docs

ROOT = Path(__file__).resolve().parent.parent


def test_generated_pages_are_current():
    # python -m tools.docs rewrites them; a change to the axes, rules, matrix keys, record fields or the
    # committed results without it leaves a page that says something else than the code.
    assert docs.stale() == [], "run `python -m tools.docs` and commit the pages it rewrites"


def test_fill_replaces_only_the_generated_blocks():
    def page(a: str, b: str) -> str:
        return f"intro\n<!-- generated: a -->\n{a}<!-- end: a -->\nmid\n<!-- generated: b -->\n{b}<!-- end: b -->\n"

    assert docs.fill(page("old\n", ""), {"a": "new A", "b": "new B"}) == page("new A\n", "new B\n")


def test_every_matrix_key_is_described():
    # docs/matrix.md lists each key with the docstring under its field in bench/matrix/spec/schema.py.
    assert docs.undocumented() == []


def test_results_catalogue_names_every_file():
    # Every committed results file (a run of the user's that wrote results/NAME.jsonl beside them is not one).
    text = (ROOT / "results" / "README.md").read_text()
    files = docs.tracked("results", "*.jsonl") + docs.tracked("results/held-out") + docs.tracked("results/gpu-evidence")
    missing = [f.name for f in files if f"`{f.name}`" not in text]
    assert not missing, f"results/README.md does not describe {missing}"
    named = set(re.findall(r"`([\w][\w.+-]*\.(?:jsonl|log|py|txt))`", text))
    where = [
        ROOT / "results",
        ROOT / "results" / "held-out",
        ROOT / "results" / "gpu-evidence",
        ROOT / "results" / "ci-cpu-gate",
        ROOT / "reports",
    ]
    gone = sorted(n for n in named if not any((d / n).exists() for d in where))
    assert not gone, f"results/README.md names files that do not exist: {gone}"


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "results" / "README.md"]


def test_links_in_the_docs_resolve():
    broken = []
    for page in _pages():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_readme_matrix_is_valid():
    # The README's example is a matrix zerobench accepts, with the cells its comments count.
    from bench.matrix import spec

    text = (ROOT / "README.md").read_text()
    (yaml,) = re.findall(r"```yaml\n(.*?)```", text, re.S)
    m = spec.loads(yaml, "README.md")
    assert len(spec.expand(m)) == 4 * 2 + 2


def test_no_development_history_in_the_product():
    # The docs and code describe what zerobench is and measured (with commits and dates), not the work
    # sessions that built it.
    paths = ["README.md", "docs", "results/README.md", "bench", "matrices"]
    pattern = (
        r"session[0-9]|(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|this|last|next) session"
        r"|rehears"
    )
    r = subprocess.run(["grep", "-rniE", pattern, *paths], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and not r.stdout, r.stdout


def test_the_readme_says_what_nox_tests_does_to_the_machine_before_its_command():
    # As root it installs Debian packages and enables services: a newcomer reads that, its time and its disk
    # before the command, not after it.
    text = (ROOT / "README.md").read_text()
    before = " ".join(text[: text.index("\n    nox -s tests\n")].split("\n\n")[-1].split())
    for fact in ("as root", "36 Debian packages", "munge, slurmd and slurmctld services", "9 to 16 minutes", "1.9 GB"):
        assert fact.lower() in before.lower(), (fact, before)
