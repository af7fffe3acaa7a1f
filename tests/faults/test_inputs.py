"""Hostile and broken inputs: each is refused before anything runs, with one message that names the file,
the key and what to do, exit code 2, no traceback, and nothing written (no results, logs or reports).

Every input goes through the real CLI in a fresh process, in an empty working directory."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.conftest import TINY, write_matrix, zerobench

# A matrix whose cells all skip on a CPU host (fp16 needs CUDA): a `run` of it is fast and writes records.
SKIPPED = TINY + "axes: {zero_stage: [0, 1], precision: [fp16]}\n"

BOMB = """\
a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def refused(cwd: Path, *args: str, says: list[str], limit_s: float = 60) -> str:
    """Run zerobench; it must exit 2 with a message (no traceback) saying each of `says`, and write nothing."""
    before = set(cwd.rglob("*"))
    t0 = time.monotonic()
    r = zerobench(*args, cwd=cwd, timeout=limit_s + 60)
    took = time.monotonic() - t0
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    for s in says:
        assert s in r.stderr, (s, r.stderr[-2000:])
    assert took < limit_s, f"took {took:.0f} s"
    assert set(cwd.rglob("*")) == before, f"wrote {set(cwd.rglob('*')) - before}"
    assert not (cwd / "results").exists() and not (cwd / "reports").exists()
    return r.stderr


# -- YAML that would cost without bound ---------------------------------------------------------------


def test_yaml_alias_bomb(tmp_path, ledger):
    ledger.fault("yaml-alias-bomb", "a 10-line YAML 'billion laughs' (9^9 values through aliases) as the matrix")
    f = write_matrix(tmp_path / "bomb.yaml", BOMB)
    refused(tmp_path, "cells", f.name, says=["bomb.yaml:6", "expands to more than 100,000 values"], limit_s=20)


def test_yaml_alias_bomb_in_an_axis(tmp_path, ledger):
    ledger.fault("yaml-alias-bomb-in-axis", "an axis whose value list is a 9^9-value alias bomb (validation walks it)")
    f = write_matrix(tmp_path / "bomb.yaml", BOMB.replace('"x"', "0") + "axes: {zero_stage: *i}\n")
    refused(tmp_path, "run", f.name, says=["bomb.yaml:", "expands to more than"], limit_s=20)


def test_yaml_alias_refers_to_itself(tmp_path, ledger):
    ledger.fault("yaml-self-reference", "an alias used inside the value it names (a recursive structure)")
    f = write_matrix(tmp_path / "self.yaml", TINY + "axes:\n  zero_stage: &z [0, *z]\n")
    refused(tmp_path, "cells", f.name, says=["self.yaml:8: axes.zero_stage[1]", "*z is used inside the value it names"])


def test_yaml_deeply_nested(tmp_path, ledger):
    ledger.fault("yaml-deep-nesting", "a matrix nested 100,000 levels deep ([[[[...]]]])")
    f = write_matrix(tmp_path / "deep.yaml", "axes: {zero_stage: " + "[" * 100_000 + "]" * 100_000 + "}\n")
    refused(tmp_path, "cells", f.name, says=["deep.yaml:1: axes.zero_stage[0][0]", "nests deeper than 32 levels"])


def test_yaml_huge_file(tmp_path, ledger):
    ledger.fault("yaml-huge-file", "a 3 MiB matrix file (a mistaken path, or generated junk)")
    f = write_matrix(tmp_path / "huge.yaml", TINY + "".join(f"# {'x' * 60} {i}\n" for i in range(50_000)))
    refused(tmp_path, "cells", f.name, says=["huge.yaml", "MiB; a matrix file is a few KB"])


def test_yaml_python_tag_never_executes(tmp_path, ledger):
    ledger.fault("yaml-python-tag", "a !!python/object/apply tag that would run a shell command")
    f = write_matrix(tmp_path / "tag.yaml", TINY + 'description: !!python/object/apply:os.system ["touch pwned"]\n')
    refused(tmp_path, "run", f.name, says=["tag.yaml:7", "not valid YAML"])
    assert not (tmp_path / "pwned").exists()


# -- files that are not matrices ------------------------------------------------------------------------


def test_matrix_binary(tmp_path, ledger):
    ledger.fault("matrix-binary", "4 KB of random bytes given as the matrix")
    f = tmp_path / "m.yaml"
    f.write_bytes(random.Random(13).randbytes(4096))
    refused(tmp_path, "cells", f.name, says=["m.yaml", "is not a UTF-8 text file", "give the matrix file itself"])


def test_matrix_latin1(tmp_path, ledger):
    ledger.fault("matrix-not-utf8", "a matrix saved as Latin-1 (an accented description)")
    f = tmp_path / "m.yaml"
    f.write_bytes((TINY + "description: café\n").encode("latin-1"))
    refused(tmp_path, "run", f.name, says=["m.yaml:7", "not a UTF-8 text file"])


@pytest.mark.parametrize(
    "fault,text",
    [("matrix-empty", ""), ("matrix-only-comments", "# name: smoke\n# axes: {zero_stage: [0]}\n\n")],
)
def test_matrix_empty(tmp_path, ledger, fault, text):
    ledger.fault(fault, f"a matrix file with no settings ({text[:20]!r}): once a silent default one-cell matrix")
    f = write_matrix(tmp_path / "m.yaml", text)
    refused(tmp_path, "run", f.name, says=["m.yaml", "the file has no settings", "smoke.yaml"])


def test_matrix_is_a_folder(tmp_path, ledger):
    ledger.fault("matrix-is-folder", "a folder given as the matrix")
    (tmp_path / "matrices").mkdir()
    refused(tmp_path, "cells", "matrices", says=["matrices", "is a folder, not a matrix file"])


def test_matrix_top_level_list(tmp_path, ledger):
    ledger.fault("matrix-top-level-list", "a YAML list where the mapping of settings belongs")
    f = write_matrix(tmp_path / "m.yaml", "- zero_stage: 0\n- zero_stage: 1\n")
    refused(tmp_path, "cells", f.name, says=["m.yaml", "expected a mapping of settings, got list"])


# -- DeepSpeed config files --------------------------------------------------------------------------


def _ds(tmp_path: Path, name: str, data: bytes | str) -> Path:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


def test_ds_config_binary(tmp_path, ledger):
    ledger.fault("ds-config-binary", "a binary file given to --ds-config")
    m = write_matrix(tmp_path / "m.yaml", TINY)
    _ds(tmp_path, "z.json", b"\x89PNG\r\n\x1a\n" + random.Random(1).randbytes(2000))
    refused(tmp_path, "cells", m.name, "--ds-config", "z.json", says=["z.json", "not a UTF-8 text file"])


def test_ds_config_deep(tmp_path, ledger):
    ledger.fault("ds-config-deep-json", "a DeepSpeed config nested 200,000 levels deep")
    m = write_matrix(tmp_path / "m.yaml", TINY)
    _ds(tmp_path, "z.json", '{"zero_optimization": ' + "[" * 200_000 + "]" * 200_000 + "}")
    refused(tmp_path, "cells", m.name, "--ds-config", "z.json", says=["z.json", "nests deeper than 32 levels"])


def test_ds_config_moderately_deep(tmp_path, ledger):
    ledger.fault("ds-config-deep-json-500", "a DeepSpeed config nested 500 levels (parses, then the checks recurse)")
    m = write_matrix(tmp_path / "m.yaml", TINY)
    _ds(tmp_path, "z.json", '{"zero_optimization": ' + '{"a": ' * 500 + "1" + "}" * 500 + "}")
    refused(tmp_path, "cells", m.name, "--ds-config", "z.json", says=["z.json", "nests deeper than 32 levels"])


def test_ds_config_huge(tmp_path, ledger):
    ledger.fault("ds-config-huge", "a 5 MiB DeepSpeed config")
    m = write_matrix(tmp_path / "m.yaml", TINY)
    _ds(tmp_path, "z.json", '{"x": [' + ",".join(["1"] * 2_500_000) + "]}")
    refused(tmp_path, "cells", m.name, "--ds-config", "z.json", says=["z.json", "MiB; a DeepSpeed config file is"])


def test_ds_config_folder(tmp_path, ledger):
    ledger.fault("ds-config-folder", "a folder given to --ds-config")
    m = write_matrix(tmp_path / "m.yaml", TINY)
    (tmp_path / "configs").mkdir()
    refused(tmp_path, "run", m.name, "--ds-config", "configs", says=["'configs' is a folder, not a DeepSpeed config"])


def test_ds_config_in_matrix_binary(tmp_path, ledger):
    ledger.fault("ds-config-axis-binary", "a matrix whose ds_config axis names a binary file")
    _ds(tmp_path, "z.json", random.Random(2).randbytes(500))
    m = write_matrix(tmp_path / "m.yaml", TINY + "axes: {ds_config: [z.json]}\n")
    refused(tmp_path, "run", m.name, says=["z.json", "not a UTF-8 text file"])


# -- arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", ["cells", "run"])
def test_filter_not_a_regex(tmp_path, ledger, cmd):
    ledger.fault(f"filter-invalid-regex-{cmd}", f"`zerobench {cmd} --filter '('` (not a regular expression)")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    refused(tmp_path, cmd, m.name, "--filter", "zero", "--filter", "(", says=["--filter: '('", "not a regular expr"])


def test_results_is_a_folder(tmp_path, ledger):
    ledger.fault("results-is-folder", "--results pointing at an existing folder")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    (tmp_path / "out").mkdir()
    refused(tmp_path, "run", m.name, "--results", "out", says=["results file out is a folder", "out/results.jsonl"])


def test_results_parent_is_a_file(tmp_path, ledger):
    ledger.fault("results-parent-is-file", "--results under a path that is a file (notes.txt/r.jsonl)")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    (tmp_path / "notes.txt").write_text("notes\n")
    refused(tmp_path, "run", m.name, "--results", "notes.txt/r.jsonl", says=["notes.txt is a file, not a folder"])


@pytest.mark.parametrize(
    "fault,name",
    [
        ("matrix-name-traversal", "../../x<script>"),
        ("matrix-name-absolute", "{tmp}/abs"),
        ("matrix-name-dotdot", ".."),
        ("matrix-name-backslash", "a\\\\b"),
        ("matrix-name-newline", "a\\nb"),
    ],
)
def test_matrix_name_is_not_a_path(tmp_path, ledger, fault, name):
    ledger.fault(fault, f"matrix `name: {name}` (results/<name>.jsonl would leave results/)")
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    m = write_matrix(work / "m.yaml", SKIPPED + f'name: "{name.format(tmp=tmp_path)}"\n')
    refused(work, "run", m.name, says=["m.yaml:8: name:", "cannot name files", "fix: use letters"])
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "m.yaml"], "nothing written anywhere"
