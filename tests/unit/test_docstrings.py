"""Every runnable example in the library's docstrings runs and shows what it claims."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import langgraph_parallelmuse

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(langgraph_parallelmuse.__path__, prefix="langgraph_parallelmuse.")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed (run with -s to see them)"
