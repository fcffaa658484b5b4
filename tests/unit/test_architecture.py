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


# The imports ARCHITECTURE.md names as exceptions to its order: (importer, imported), by listed name.
EXCEPTIONS = {
    ("nodes", "models/routing"),  # a leaf: the per-question routing key the nodes set
    ("graph", "tools"),  # create_parallelmuse's default corpus tools, imported when given none
}
SUBPACKAGES = ("models", "tools", "serving")


def _listed_order() -> list[str]:
    """Core modules in the order ARCHITECTURE.md lists them (its bullets' first names; a subpackage's
    as ``models/local``)."""
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    order: list[str] = []
    for line in text.splitlines():
        if line.startswith("- `"):
            head = line.split("`:")[0]  # "- `compress.py` / `aggregate.py" names two modules
            for name in re.findall(r"`([\w/]+)\.py", head + "`"):
                if name not in order:
                    order.append(name)
    return order


def _name(module: str) -> str:
    """A module's listed name: ``nodes``, ``models/routing``; a subpackage itself is ``tools``."""
    parts = module.split(".")[1:]
    if parts and parts[0] in SUBPACKAGES:
        return "/".join(parts[:2])
    return parts[0] if parts else "langgraph_parallelmuse"


def _position(name: str, order: list[str]) -> int:
    """Where ``name`` comes in the list; a subpackage's module (free to import the others of its
    subpackage) where its subpackage's first listed module does."""
    package = name.split("/")[0]
    if package in SUBPACKAGES:
        return next(i for i, listed in enumerate(order) if listed.startswith(package + "/"))
    return order.index(name) if name in order else -1


def _imports(path: Path) -> list[str]:
    """The package modules ``path`` imports (lazily too), by listed name."""
    used = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("langgraph_parallelmuse"):
            used.append(_name(node.module))
        elif isinstance(node, ast.Import):
            used += [_name(a.name) for a in node.names if a.name.startswith("langgraph_parallelmuse")]
    return used


def _allowed(name: str, used: str, order: list[str]) -> bool:
    """Whether module ``name`` may import ``used``: listed above it, or of its own subpackage."""
    if "/" in name and used.split("/")[0] == name.split("/")[0]:
        return True  # one subpackage's modules import each other
    if used.split("/")[0] not in SUBPACKAGES and used not in order:
        return False  # unlisted (the package root, say)
    return _position(used, order) < _position(name, order)


def _wrong_imports() -> set[tuple[str, str]]:
    """(importer, imported) of every core import of a module not listed above the importer."""
    order = _listed_order()
    wrong = set()
    for path in CORE:
        name = _name("langgraph_parallelmuse." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        if name == "__init__":
            continue  # the package's re-exports
        wrong |= {(name, used) for used in _imports(path) if not _allowed(name, used, order)}
    return wrong


def test_each_core_module_imports_only_modules_listed_above_it_in_architecture_md():
    order = _listed_order()
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "cli"}
    assert top <= set(order), f"ARCHITECTURE.md lists no line for {sorted(top - set(order))}"
    unlisted = [p for p in SUBPACKAGES if not any(name.startswith(p + "/") for name in order)]
    assert not unlisted, f"ARCHITECTURE.md lists no module of {unlisted}"
    wrong = _wrong_imports()
    assert not wrong - EXCEPTIONS, (
        f"data flows one way: {sorted(wrong - EXCEPTIONS)} (move the shared part up, or fix ARCHITECTURE.md's order)"
    )
    assert not EXCEPTIONS - wrong, f"no longer imported: drop {sorted(EXCEPTIONS - wrong)} from the exceptions"


def test_a_core_modules_import_of_a_subpackage_below_it_is_found():
    """The subpackages count: infograph once imported NO_HITS from tools.local_tools, which the check
    (top-level modules only) missed."""
    order = _listed_order()
    assert _position("tools/local_tools", order) > _position("infograph", order)
    assert _position("models/requests", order) == _position("models/local", order)  # a subpackage's module
    assert _name("langgraph_parallelmuse.models.routing") == "models/routing"
    assert _name("langgraph_parallelmuse.tools") == "tools" and _name("langgraph_parallelmuse.nodes") == "nodes"
