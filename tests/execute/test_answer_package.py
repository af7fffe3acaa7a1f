"""Answer mode is one component (bench/execute/answer/): no module outside it reaches its private names, and it is
made of parts a reader can hold: no class over 300 lines, no module over 800, at most 12 modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "bench" / "execute" / "answer"
MODULE = "bench.execute.answer"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _trees(paths) -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(paths)]


def _private_names() -> set[str]:
    """Every private name the package defines: its modules' functions, classes and globals, its classes' methods and
    attributes, and the attributes its code sets on self."""
    names = set()
    for _, tree in _trees(PACKAGE.glob("*.py")):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return {n for n in names if _private(n)}


def _reaches(tree: ast.Module, private: set[str]) -> list[str]:
    """Where a module reaches a private name of the package: imported from it, read off it or off one of its objects
    (any value but the module's own self or cls)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(MODULE):
            out += [f"line {node.lineno}: imports {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and node.attr in private:
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner not in ("self", "cls"):
                out.append(f"line {node.lineno}: {ast.unparse(node)}")
    return out


def test_no_module_outside_the_answer_package_uses_its_private_names():
    private = _private_names()
    assert {"_memo", "_turn", "_settled", "_drawn"} <= private  # the walk sees the package's own
    outside = [p for d in ("bench", "tools") for p in (ROOT / d).rglob("*.py") if PACKAGE not in p.parents]
    found = {str(p.relative_to(ROOT)): hits for p, tree in _trees(outside) if (hits := _reaches(tree, private))}
    assert not found, f"private names of {MODULE} used outside it (make them public, or move the code in): {found}"


def test_the_walk_finds_a_private_name_read_off_a_search():
    private = _private_names()
    tree = ast.parse("from bench.execute.answer.text import _settled\nfor g in s._groups(): s._memo.clear()\n")
    assert len(_reaches(tree, private | {"_groups"})) == 3
    assert not _reaches(ast.parse("self._memo.clear()\nx = s.groups()\n"), private)


def test_no_class_of_the_answer_package_exceeds_300_lines_nor_a_module_800():
    trees = _trees(PACKAGE.glob("*.py"))
    assert len(trees) <= 12, [p.name for p, _ in trees]
    long = [
        f"{p.name}: {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for p, tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 300
    ]
    assert not long, long
    big = [f"{p.name}: {n} lines" for p, _ in trees if (n := len(p.read_text().splitlines())) > 800]
    assert not big, big
    assert any(node.name == "Search" for _, tree in trees for node in ast.walk(tree) if isinstance(node, ast.ClassDef))
