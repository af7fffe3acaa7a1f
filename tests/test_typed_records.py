"""Records cross bench/ typed: from the store to the report a record is a bench.records.record.Record, never a dict
read back. This reads the annotations of every function in bench/ (the source alone, as tests/test_architecture.py
does) and names each one that takes or returns a collection of dicts of records.

A collection of dicts (list, Sequence, Iterable, Iterator, ... of dict, alone or inside a tuple, a union or a
mapping's values) is "of records" where its parameter or its function is named for records (rec, recs, record,
records, recorded, written, existing): the names bench/ gives records wherever they travel. A collection so named
that holds something else is allowed only with its reason in NOT_RECORDS. And the functions that hand records on
(the store's readers, `run`, `selfcheck`) are checked by their resolved annotations to give Records."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from .conftest import ROOT

BENCH = ROOT / "bench"
COLLECTIONS = {
    "list", "List", "Sequence", "MutableSequence", "Iterable", "Iterator", "Collection", "Generator", "set",
    "frozenset", "tuple", "Tuple", "deque", "AsyncIterator", "AsyncIterable",
}  # fmt: skip
MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping"}
RECORD_NAMES = re.compile(r"(^|_)(rec|recs|record|records|recorded|written|existing)($|_)")

# (stage folder, function name) -> why its collection of dicts, named like records, is not of records.
NOT_RECORDS = {
    ("report", "records"): "rows of a DataFrame (pandas' 'records' orient) for a table, not stored records",
    ("judge", "_one_schedule"): "one cell's rows of the results DataFrame (bench.judge.results), not stored records",
    ("records", "record_ops"): "'record' the verb: the machine's cache keeps a prebuild's report, op by op",
}


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _parsed(node: ast.expr) -> ast.expr:
    """An annotation written as a string (a forward reference) as the expression it names."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return ast.parse(node.value, mode="eval").body
    return node


def _is_dict(node: ast.expr) -> bool:
    node = _parsed(node)
    if isinstance(node, ast.BinOp):  # dict | None
        return _is_dict(node.left) or _is_dict(node.right)
    if isinstance(node, ast.Subscript):
        return _name(node.value) in MAPPINGS or (_name(node.value) == "Optional" and _is_dict(node.slice))
    return _name(node) in MAPPINGS


def _of_dicts(node: ast.expr | None) -> bool:
    """The annotation holds a collection of dicts: list[dict], Iterable[dict | Record], tuple[X, list[dict]],
    dict[str, dict] (dicts by key), ..."""
    if node is None:
        return False
    node = _parsed(node)
    if isinstance(node, ast.BinOp):
        return _of_dicts(node.left) or _of_dicts(node.right)
    if not isinstance(node, ast.Subscript):
        return False
    args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    outer = _name(node.value)
    if outer in COLLECTIONS and any(_is_dict(a) for a in args):
        return True
    if outer in MAPPINGS and len(args) == 2 and _is_dict(args[1]):  # dicts by key: dict[str, dict]
        return True
    return any(_of_dicts(a) for a in args)


def offences(source: str, stage: str) -> list[str]:
    """Each function of the source that takes or returns a collection of dicts of records, as `name(param)` or
    `name -> `; those NOT_RECORDS allows are left out."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (stage, node.name) in NOT_RECORDS:
            continue
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]:
            if _of_dicts(arg.annotation) and (RECORD_NAMES.search(arg.arg) or RECORD_NAMES.search(node.name)):
                found.append(f"{node.name}({arg.arg}: {ast.unparse(arg.annotation)}), line {node.lineno}")
        if _of_dicts(node.returns) and RECORD_NAMES.search(node.name):
            found.append(f"{node.name} -> {ast.unparse(node.returns)}, line {node.lineno}")
    return found


def _stage(path: Path) -> str:
    parts = path.relative_to(BENCH).parts
    return parts[0] if len(parts) > 1 else ""


def test_no_function_in_bench_takes_or_returns_dicts_of_records():
    bad = {
        str(p.relative_to(ROOT)): found
        for p in sorted(BENCH.rglob("*.py"))
        if (found := offences(p.read_text(), _stage(p)))
    }
    assert not bad, (
        "records cross bench/ as bench.records.record.Record (read fields, not keys); type these, or say in "
        f"NOT_RECORDS why the dicts are not records: {bad}"
    )


@pytest.mark.parametrize(
    "source",
    [
        "def f(records: list[dict]) -> None: ...",
        "def f(recs: 'Sequence[dict[str, Any]]'): ...",
        "def read_records(path) -> Iterator[dict]: ...",
        "def f(rec: Iterable[dict | Record]): ...",
        "class S:\n    def records(self) -> list[dict]: ...",
        "def records(path) -> tuple[Plan, Path, list[dict]]: ...",
        "def f(written: list[dict] | None = None): ...",
        "def latest_records(path) -> dict[str, dict]: ...",
    ],
)
def test_the_check_finds_dicts_of_records(source):
    assert offences(source, "execute"), source


def test_the_check_leaves_other_dicts_and_typed_records_alone():
    source = (
        "def f(records: list[Record]) -> list[Record]: ...\n"
        "def g(rows: list[dict]) -> list[dict]: ...\n"
        "def by_hash(cells: dict[str, dict]) -> dict[str, Record]: ...\n"
        "def record(ds_config: dict, recorded: dict | None) -> dict[str, Any]: ...\n"
        "def records(frame, cols) -> list[dict]: ...\n"  # allowed in the report stage (NOT_RECORDS)
    )
    assert offences(source, "report") == []


def _gives_records(fn) -> bool:
    """Record appears in the function's resolved return annotation, and no dict does."""
    from bench.records.record import Record

    def walk(t):
        yield t
        for a in typing.get_args(t):
            yield from walk(a)

    parts = list(walk(typing.get_type_hints(fn)["return"]))
    return Record in parts and dict not in parts


def test_the_readers_and_the_run_hand_on_records():
    from bench.execute import run
    from bench.execute.selfcheck import selfcheck
    from bench.records import store

    for fn in (
        store.read, store.read_records, store.numbered_records, store.Store.records, store.Store.latest,
        store.Store.resume_state, run, selfcheck,
    ):  # fmt: skip
        assert _gives_records(fn), f"{fn.__module__}.{fn.__qualname__} gives {typing.get_type_hints(fn)['return']}"
