"""Fault injected: unusable input and settings.

Empty/whitespace/non-text/oversized questions, every invalid budget or sampling setting, a tool
list without ``search`` and a model without logprobs. Each must raise one clear library error
(``InputError``/``ConfigError``/``MissingLogprobsError``) that names the setting and the fix,
and — except for missing logprobs, which can only be seen in a reply — before any model call.
"""

from __future__ import annotations

from collections import Counter

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.errors import ConfigError, InputError, MissingLogprobsError
from langgraph_parallelmuse.graph import create_parallelmuse
from langgraph_parallelmuse.nodes import MAX_QUESTION_CHARS
from tests.unit.fakes import (
    Reply,
    ScriptedChatModel,
    answer_text,
    make_tools,
    research_responder,
    role_of,
)

pytestmark = pytest.mark.timeout(60)

QUESTION = "What is the capital of France?"


def _graph(config=None, agent=None):
    agent = agent or (lambda i, msgs: Reply(answer_text("Paris")))
    model = ScriptedChatModel(responder=research_responder(agent))
    tools, calls = make_tools()
    return (
        create_parallelmuse(model, tools, config=config or {"n": 2, "mode": "none"}),
        model,
        calls,
    )


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"question": ""}, "question is empty"),
        ({"question": " \t\n "}, "question is empty"),
        ({"question": 42}, "must be text, got int"),
        ({"question": b"bytes"}, "must be text, got bytes"),
        ({"question": ["a", "list"]}, "must be text, got list"),
        (
            {"messages": [HumanMessage(content=[{"type": "image_url", "image_url": {"url": "x"}}])]},
            "question is empty",
        ),
        ({"messages": []}, "no question"),
        ({"messages": [AIMessage("only the assistant spoke")]}, "no question"),
        ({"question": "x" * (MAX_QUESTION_CHARS + 1)}, "shorten it"),
        # A lone surrogate (a non-UTF-8 byte of a command line) was accepted; writing the result failed.
        ({"question": "Capital of \udcff France?"}, "not valid UTF-8 .*: send it as UTF-8 text"),
    ],
    ids=[
        "empty",
        "whitespace",
        "int",
        "bytes",
        "list",
        "image-only",
        "no-messages",
        "no-human",
        "oversized",
        "not-utf8",
    ],
)
async def test_unusable_question_raises_input_error_before_any_model_call(payload, message):
    graph, model, calls = _graph()
    with pytest.raises(InputError, match=message):
        await graph.ainvoke(payload)
    assert model.calls == []
    assert calls == {"search": [], "visit": []}


def test_question_at_the_size_limit_is_accepted():
    graph, model, _ = _graph({"n": 1, "mode": "none", "aggregation": "majority"})
    out = graph.invoke({"question": "q" * MAX_QUESTION_CHARS})
    assert out["answer"] == "Paris" and len(model.calls) == 1


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({"n": 1, "m": 2}, ["m=2 > n=1"]),
        ({"n": 8, "k": -1}, ["k=-1", "0 or more"]),
        ({"n": 8, "t": 0}, ["t=0", "at least 1"]),
        ({"n": 8, "mode": "bogus"}, ["mode:", "'exploration'", "'none'"]),
        ({"n": 8, "estimator": "variance"}, ["estimator:", "'nll'", "'entropy'"]),
        ({"n": 8, "temperature": 2.5}, ["temperature=2.5", "[0, 2]"]),
        ({"n": 8, "temperature": -0.1}, ["temperature=-0.1", "[0, 2]"]),
        ({"n": 8, "max_turns": 0}, ["max_turns=0", "at least 1 turn"]),
        ({"n": 3}, ["n=3 < m + m*k*t = 7", "raise n or lower k/t"]),
        ({"n": 8, "tool_timeout": 0}, ["tool_timeout=0", "positive"]),
        ({"n": 8, "max_concurrency": 0}, ["max_concurrency=0", "positive"]),
        ({"n": 8, "nn": 3}, ["nn:", "Extra inputs"]),
    ],
    ids=[
        "n<m",
        "k<0",
        "t<1",
        "mode",
        "estimator",
        "temp-high",
        "temp-low",
        "max_turns",
        "budget",
        "tool_timeout",
        "concurrency",
        "typo",
    ],
)
def test_invalid_config_names_the_setting_and_the_fix(config, names):
    model = ScriptedChatModel()
    with pytest.raises(ConfigError) as info:
        create_parallelmuse(model, make_tools()[0], config=config)
    text = str(info.value)
    assert text.startswith("invalid ParallelMuse config: ")
    for name in names:
        assert name in text
    assert "\n" not in text  # one line, not a pydantic dump
    assert model.calls == []
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("config", ['{"n": 4, "k": 1}', "calibration.json", 4, [("n", 4)]])
def test_a_config_that_is_no_mapping_names_what_to_pass(config):
    # Before: a raw ValueError or TypeError from dict(config).
    with pytest.raises(ConfigError, match="pass a dict of settings .* or a ParallelMuseConfig"):
        create_parallelmuse(ScriptedChatModel(), make_tools()[0], config=config)


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as info:
        make_config(n=8, k=-1, temperature=9, max_turns=0)
    assert all(s in str(info.value) for s in ("k=-1", "temperature=9", "max_turns=0"))


async def test_invalid_per_run_context_fails_before_any_model_call():
    graph, model, calls = _graph({"n": 4, "m": 1, "k": 1, "t": 2})
    with pytest.raises(ConfigError, match="temperature=5"):
        await graph.ainvoke({"question": QUESTION}, context={"temperature": 5})
    assert model.calls == [] and calls == {"search": [], "visit": []}


def test_tool_list_without_search_is_rejected_at_build_time():
    model = ScriptedChatModel()
    _, visit = make_tools()[0]
    for tools in ([visit], []):
        with pytest.raises(InputError, match="one named 'search'.*make_corpus_tools"):
            create_parallelmuse(model, tools)
    assert model.calls == []


async def test_model_without_logprobs_fails_fast_naming_the_fix():
    no_lp = lambda i, msgs: Reply(answer_text("Paris"), logprobs=False)  # noqa: E731
    graph, model, calls = _graph({"n": 4, "m": 1, "k": 1, "t": 2}, agent=no_lp)
    with pytest.raises(MissingLogprobsError) as info:
        await graph.ainvoke({"question": QUESTION})
    assert "mode='none'" in str(info.value) and "logprobs=True" in str(info.value)
    # Only the initial trajectory and the fill that runs beside it made a call (the initial reply
    # is where the missing logprobs show); no branch, report or aggregation call was made.
    assert Counter(role_of(c["messages"]) for c in model.calls) == Counter({"agent": 2})


async def test_model_without_logprobs_runs_with_mode_none():
    no_lp = lambda i, msgs: Reply(answer_text("Paris"), logprobs=False)  # noqa: E731
    graph, model, _ = _graph({"n": 3, "mode": "none"}, agent=no_lp)
    out = await graph.ainvoke({"question": QUESTION})
    assert out["answer"] == "Paris" and len(out["trajectories"]) == 3
    assert all(s["tokens"] == [] for t in out["trajectories"] for s in t["steps"])


def test_without_the_local_extra_the_embedded_model_names_the_extra_to_install():
    # Without torch the engine's import failed deep in a node (the CLI's agent printed "None").
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from langgraph_parallelmuse.models import LocalChatModel\n"
        "from langgraph_parallelmuse.errors import ConfigError\n"
        "try:\n"
        "    LocalChatModel.embedded().engine\n"
        "except ConfigError as exc:\n"
        "    print('ConfigError:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "ConfigError: the in-process model needs torch" in done.stdout, done.stderr[-2000:]
    assert "langgraph-parallelmuse[local]" in done.stdout


def test_the_local_extra_list_the_model_checks_is_pyprojects():
    import re
    import tomllib
    from pathlib import Path

    from langgraph_parallelmuse.models.local import _LOCAL_EXTRA

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    names = {re.split(r"[<>=\[ ]", req)[0] for req in pyproject["project"]["optional-dependencies"]["local"]}
    assert _LOCAL_EXTRA == names


def test_the_studio_embedded_graph_without_the_local_extra_imports_and_names_it_on_use():
    # It loaded the model at import, so without torch the import failed, which takes the whole
    # `langgraph dev` server down, the graphs that need no torch included.
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, runpy; sys.modules['torch'] = None\n"
        "module = runpy.run_path('graphs/embedded.py')\n"
        "try:\n"
        "    module['graph']()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ConfigError the in-process model needs torch" in done.stdout


@pytest.mark.parametrize("field", ["n", "temperature", "seed", "max_turns"])
def test_true_or_false_for_a_number_is_refused(field):
    # pydantic read n=True as 1: the run had one trajectory.
    with pytest.raises(ConfigError, match=f"{field}=True: give a number, not true/false"):
        make_config(**{field: True})
    assert make_config(diverse_branches=True).diverse_branches is True
