"""The package's shape: small functions, and data flowing one way (the core never imports ``eval`` or ``cli``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "langgraph_parallelmuse"
CORE = sorted(p for p in PACKAGE.rglob("*.py") if "eval" not in p.relative_to(PACKAGE).parts and p.name != "cli.py")
MAX_LINES = 80


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_core_function_is_longer_than_80_lines(path):
    tree = ast.parse(path.read_text())
    long = [
        f"{f.name} ({f.end_lineno - f.lineno + 1} lines)"
        for f in _functions(tree)
        if f.end_lineno - f.lineno >= MAX_LINES
    ]
    assert not long, f"{path.name}: split {', '.join(long)}"


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_core_never_imports_the_evaluation_package_or_the_cli(path):
    tree = ast.parse(path.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    bad = [m for m in names if m.startswith(("langgraph_parallelmuse.eval", "langgraph_parallelmuse.cli"))]
    assert not bad, f"{path.name} imports {bad}: move what both need into the core"


def _listed_order() -> list[str]:
    """Top-level core modules in the order ARCHITECTURE.md lists them (its bullets' first names)."""
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    order: list[str] = []
    for line in text.splitlines():
        if line.startswith("- `"):
            head = line.split("`:")[0]  # "- `compress.py` / `aggregate.py" names two modules
            for name in re.findall(r"`(\w+)\.py", head + "`"):
                if name not in order:
                    order.append(name)
    return order


def test_each_core_module_imports_only_modules_listed_above_it_in_architecture_md():
    order = _listed_order()
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "cli"}
    assert top <= set(order), f"ARCHITECTURE.md lists no line for {sorted(top - set(order))}"
    wrong = []
    for name in order:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("langgraph_parallelmuse."):
                used = node.module.split(".")[1]
                if used in order and order.index(used) > order.index(name):
                    wrong.append(f"{name} imports {used}")
    assert not wrong, f"data flows one way: {wrong} (move the shared part up, or fix ARCHITECTURE.md's order)"
