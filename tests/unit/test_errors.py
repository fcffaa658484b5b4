"""The library's exceptions: picklable, and a run's finished work attached to the run's own error."""

from __future__ import annotations

import pickle

from langgraph_parallelmuse import errors
from langgraph_parallelmuse.errors import ConfigError, RolloutFailedError


def test_a_rollout_failure_survives_pickling_with_its_result():
    # Before: pickle rebuilt it as RolloutFailedError(message), without the keyword-only result: TypeError.
    failed = RolloutFailedError("every trajectory failed (2 of 2)", result={"question": "q", "trajectories": []})
    failed.add_note("the server at 127.0.0.1:8000 was down")
    back = pickle.loads(pickle.dumps(failed))
    assert type(back) is RolloutFailedError and str(back) == str(failed)
    assert back.result == failed.result and back.__notes__ == failed.__notes__


def test_an_error_carrying_another_runs_result_is_copied_not_overwritten():
    failed = RolloutFailedError("every trajectory failed", result={"question": "q1"})
    again = errors.with_result(failed, {"question": "q2"})
    assert failed.result == {"question": "q1"}
    assert type(again) is RolloutFailedError and again.args == failed.args and again.result == {"question": "q2"}
    fresh = ConfigError("bad")
    assert errors.with_result(fresh, {"question": "q3"}) is fresh and fresh.result == {"question": "q3"}


def test_a_note_added_to_a_runs_copy_stays_off_the_stored_error():
    stored = ConfigError("no prompt_logprobs")
    stored.result = {"question": "q1"}
    stored.add_note("first run")
    again = errors.with_result(stored, {"question": "q2"})
    again.add_note("second run")
    assert stored.__notes__ == ["first run"] and again.__notes__ == ["first run", "second run"]


def test_every_exception_the_package_defines_derives_from_parallelmuse_error():
    """ARCHITECTURE.md says so (of every public one: a caller may meet it); ``ToolArgumentError`` was a
    bare ``ValueError``."""
    import importlib
    import pkgutil

    import langgraph_parallelmuse
    from langgraph_parallelmuse.errors import InputError, ParallelMuseError
    from langgraph_parallelmuse.tools import ToolArgumentError

    names = [m.name for m in pkgutil.walk_packages(langgraph_parallelmuse.__path__, prefix="langgraph_parallelmuse.")]
    defined = [
        value
        for name in names
        for value in vars(importlib.import_module(name)).values()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == name
        and not value.__name__.startswith("_")  # a module's own signal, caught where it is raised
    ]
    assert ToolArgumentError in defined
    assert not [e.__qualname__ for e in defined if not issubclass(e, ParallelMuseError)]
    # A tool call's bad arguments are the caller's input; ``except ValueError`` still catches them.
    assert issubclass(ToolArgumentError, InputError) and issubclass(ToolArgumentError, ValueError)
