"""Settings every test directory shares."""

from __future__ import annotations

import contextlib

with contextlib.suppress(ImportError):  # hypothesis is a test extra: only the property tests need it
    from hypothesis import settings

    # The same examples on every run of the same tests (what a test draws also depends on the tests run
    # before it in the process): a property test that drew new random ones failed CI on a case
    # no change had made (a label before "_" after a combining mark). A failure found here is added
    # as an @example; random exploration is for a developer's own runs (--hypothesis-profile=default).
    settings.register_profile("deterministic", derandomize=True)
    settings.load_profile("deterministic")
