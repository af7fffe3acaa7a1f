"""The package's shape (docs/architecture.md): no module imports itself back through others, the root keeps at
most eight modules (the stages are folders), every function can be read at once, and no module, class or folder
outgrows its size (lines, lines, modules). The import contracts between and within the stages are lint-imports'
(pyproject.toml, `nox -s lint`); this reads the source alone."""

from __future__ import annotations

import ast
from pathlib import Path

from .conftest import ROOT

BENCH = ROOT / "bench"
MAX_LINES, MAX_PARAMS = 80, 8


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The bench modules a file imports, wherever the import sits (a function's import is an edge too), but under
    `if TYPE_CHECKING:`: an annotation's name is not imported when the program runs."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if _type_checking(node) for b in node.body for n in ast.walk(b)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {m for m in found if m in modules}


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in BENCH.rglob("*.py")}
    return {m: _imports(p, set(files)) - {m} for m, p in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while (x := stack.pop()) != v:
                        on.discard(x)
                        comp.append(x)
                    on.discard(v)
                    out.append([v, *comp]) if comp else None
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return out


def test_no_module_imports_itself_back_through_others():
    graph = _graph()
    assert (
        len(graph) >= 90 and "bench.execute.session" in graph["bench.execute.run"]
    )  # the reader found the package and its imports
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "c", "b"]]


def test_the_root_keeps_at_most_eight_modules():
    root = sorted(p.name for p in BENCH.glob("*.py"))
    assert len(root) <= 8, root


def _signature_size(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return n - bool(a.args and a.args[0].arg in ("self", "cls"))


def test_every_function_reads_at_once():
    """At most 80 lines and 8 parameters (self not counted); a dataclass's generated constructor is no function
    here."""
    over = []
    for path in sorted(BENCH.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = fn.end_lineno - fn.lineno + 1
                params = _signature_size(fn)
                if lines > MAX_LINES or params > MAX_PARAMS:
                    over.append(f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}: {lines} lines, {params} parameters")
    assert over == []


MAX_MODULE_LINES, MAX_CLASS_LINES, MAX_FOLDER_MODULES = 800, 300, 12
# Being split: known to be over a limit while their splits are under way; each entry is deleted when its split
# lands (an entry no longer over its limit fails test_the_sizes_hold, so none outlives its split).
BEING_SPLIT: dict[str, str] = {}


def _is_record(cls: ast.ClassDef, records: set[str]) -> bool:
    """A pydantic model, a dataclass or an enum (its fields are not logic), by its bases and decorators; a base
    defined earlier in the module counts as it does."""
    bases = {ast.unparse(b).rpartition(".")[2] for b in cls.bases}
    decorators = {ast.unparse(d.func if isinstance(d, ast.Call) else d).rpartition(".")[2] for d in cls.decorator_list}
    return bool(bases & ({"BaseModel", "Enum", "StrEnum", "IntEnum"} | records) or "dataclass" in decorators)


def _oversized(root: Path) -> dict[str, str]:
    """What under root passes a size limit, as `{place: what}`: a module over MAX_MODULE_LINES lines, a class
    other than a record over MAX_CLASS_LINES, a folder with more than MAX_FOLDER_MODULES modules directly in it."""
    over = {}
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root.parent).as_posix()
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            over[name] = "lines"
        records: set[str] = set()
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                if _is_record(node, records):
                    records.add(node.name)
                elif node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                    over[f"{name}:{node.name}"] = "class lines"
    for folder in sorted({p.parent for p in root.rglob("*.py")}):
        if len(list(folder.glob("*.py"))) > MAX_FOLDER_MODULES:
            over[folder.relative_to(root.parent).as_posix()] = "modules in the folder"
    return over


def test_the_sizes_hold():
    """At most 800 lines a module, 300 a class (records aside: a pydantic model's, a dataclass's or an enum's
    fields are not logic), 12 modules directly in a folder; BEING_SPLIT names the known exceptions."""
    over = _oversized(BENCH)
    assert {k: v for k, v in over.items() if k not in BEING_SPLIT} == {}
    assert {k: v for k, v in BEING_SPLIT.items() if over.get(k) != v} == {}, "split: delete its BEING_SPLIT entry"


def test_the_size_check_finds_what_is_over(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "wide").mkdir(parents=True)
    for i in range(MAX_FOLDER_MODULES + 1):
        (pkg / "wide" / f"m{i}.py").write_text("")
    (pkg / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    body = "    x = 1\n" * MAX_CLASS_LINES  # a class of one line more than the limit
    (pkg / "logic.py").write_text(f"class Logic:\n{body}\nclass Small:\n    x = 1\n")
    (pkg / "fields.py").write_text(f"from dataclasses import dataclass\n\n@dataclass\nclass Fields:\n{body}")
    (pkg / "model.py").write_text(f"from pydantic import BaseModel\n\nclass Model(BaseModel):\n{body}")
    (pkg / "strict.py").write_text(
        f"from pydantic import BaseModel\n\nclass A(BaseModel):\n    x = 1\nclass B(A):\n{body}"
    )
    assert _oversized(pkg) == {
        "pkg/logic.py:Logic": "class lines",
        "pkg/long.py": "lines",
        "pkg/wide": "modules in the folder",
    }
