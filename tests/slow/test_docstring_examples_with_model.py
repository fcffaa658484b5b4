"""The docstring examples the fast suite skips because they load SmolLM2 run and show what they claim.

The fast suite (``tests/unit/test_docstrings.py``) runs every other example; these are marked
``+SKIP`` there, so without this test they could drift from the model's real output unseen.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

pytestmark = pytest.mark.slow

# Modules whose skipped examples need only the embedded model (no server, no network, no writes
# outside the process): the serving, Tavily and export examples are covered by their own tests.
MODULES = [
    "langgraph_parallelmuse.models.decoding",
    "langgraph_parallelmuse.models.engine",
    "langgraph_parallelmuse.models.loading",
    "langgraph_parallelmuse.models.local",
    "langgraph_parallelmuse.models.runner",
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", MODULES)
def test_the_examples_that_load_the_model_run(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    skipped = 0
    for test in doctest.DocTestFinder().find(module):
        for example in test.examples:
            skipped += bool(example.options.pop(doctest.SKIP, False))
        runner.run(test)
    assert skipped, f"{name} has no skipped example left: take it off this list"
    assert runner.failures == 0, f"{runner.failures} docstring example(s) of {name} failed (run with -s to see them)"
