"""The benchmark harness with a scripted model over a real (tiny) full-text index: the method
registry, paired samples, and resume without repeating a question."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import re
from pathlib import Path

import pytest

from langgraph_parallelmuse.errors import ConfigError, CorpusError, RolloutFailedError
from langgraph_parallelmuse.eval.bench import (
    METHODS,
    BenchSettings,
    finished_records,
    fork_table,
    load_done,
    markdown_table,
    rollout_table,
    run_bench,
    run_facts,
    summarize,
    write_outputs,
)
from langgraph_parallelmuse.eval.datasets import QAItem
from langgraph_parallelmuse.eval.plots import uncertainty_profile
from langgraph_parallelmuse.tools import CorpusIndex
from tests.unit.fakes import (
    Reply,
    ScriptedChatModel,
    answer_text,
    call_text,
    report_from_prompt,
    research_responder,
    role_of,
)

DOCS = [
    {"id": "d1", "title": "Paris", "text": "Paris is the capital of France."},
    {"id": "d2", "title": "Rome", "text": "Rome is the capital of Italy."},
    {"id": "d3", "title": "Madrid", "text": "Madrid is the capital of Spain."},
]


def _item(i: int, question: str, answer: str, doc: str) -> QAItem:
    return QAItem(f"q{i}", question, [answer], [doc], [d["id"] for d in DOCS], "toy")


ITEMS = [
    _item(1, "What is the capital of France?", "Paris", "d1"),
    _item(2, "What is the capital of Italy?", "Rome", "d2"),
    _item(3, "What is the capital of Spain?", "Madrid", "d3"),
]
ANSWERS = {item.question: item.answers[0] for item in ITEMS}


def _question(messages) -> str:
    return next(q for q in ANSWERS if any(q in str(m.content) for m in messages))


def _agent(index, messages):
    if index == 0:
        return Reply(call_text("search", "Look it up", query="capital"), regions={"tool_call": -2.0})
    return Reply(answer_text(ANSWERS[_question(messages)]), regions={"think": -1.0})


@pytest.fixture
def index(tmp_path, monkeypatch):
    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return CorpusIndex.from_jsonl(corpus)


def _model(*, on: str | None = None, hook=None):
    """The scripted model; ``hook()`` runs when a prompt mentions question ``on``."""
    respond = research_responder(_agent)

    def responder(messages):
        if on is not None and any(on in str(m.content) for m in messages):
            hook()
        return respond(messages)

    return ScriptedChatModel(responder=responder)


SMALL = {"n": 4, "k": 1, "t": 2, "modes": ("exploration",)}


def _refused():
    raise ConnectionError("Connection refused")


@pytest.fixture
def fast_retries(monkeypatch):
    """The library's retries of a refused connection, backing off in ms."""
    from langgraph_parallelmuse import retry

    monkeypatch.setattr(retry.with_retries, "__kwdefaults__", {"retries": 2, "base_delay": 0.005})


async def test_every_registered_method_is_scored_on_paired_samples(index, tmp_path):
    settings = BenchSettings(**SMALL)
    assert settings.method_names() == [
        "no_scaling",
        "majority",
        "weighted",
        "max_tool_calls",
        "aggregation_only",
        "partial_exploration",
        "parallelmuse_exploration",
    ]
    (rec,) = await run_bench(_model(), index, ITEMS[:1], settings, tmp_path / "r.jsonl")
    assert set(settings.method_names()) <= set(rec["methods"])
    methods = rec["methods"]
    assert methods["majority"]["answer"] == "Paris" and methods["majority"]["em"] == 1.0
    assert methods["parallelmuse_exploration"]["source"] == "aggregator"
    # Paired: the partial set's from-scratch members are the from-scratch samples themselves.
    scratch = methods["majority"]["trajectories"]
    partial = methods["partial_exploration"]["trajectories"]
    assert partial[0] == scratch[0] and set(partial) - set(scratch) == {"exp.t0.s0.b0", "exp.t0.s0.b1"}
    assert methods["parallelmuse_exploration"]["cost"]["report_tokens"] > 0
    # Each trajectory's tool calls are kept with their step, for diversity analyses.
    assert rec["trajectories"]["t0"]["calls"] == [[0, '["search", {"query": "capital"}]']]
    assert "report_tokens" not in methods["majority"]["cost"]


async def test_selected_methods_only_run_the_stages_they_need(index, tmp_path):
    model = _model()
    settings = BenchSettings(**{**SMALL, "methods": ("majority", "weighted")})
    (rec,) = await run_bench(model, index, ITEMS[:1], settings, tmp_path / "r.jsonl")
    assert set(rec["methods"]) == {"majority", "weighted"}
    assert rec["reports"] == {} and rec["picks"] == {}
    # Four from-scratch trajectories of two steps each, nothing else: no branches, no reports.
    assert len(model.calls) == 4 * 2


def test_an_unknown_method_or_mode_is_a_config_error_naming_the_choices():
    with pytest.raises(ConfigError, match="unknown bench method.*majorty.*choose from no_scaling"):
        BenchSettings(methods=("majorty",))
    with pytest.raises(ConfigError, match="mode"):
        BenchSettings(modes=("explore",))
    with pytest.raises(ConfigError, match="always runs"):
        BenchSettings(modes=("none",))
    assert set(METHODS) >= {"no_scaling", "majority", "weighted", "max_tool_calls", "aggregation_only"}


def test_a_negative_seed_is_refused_up_front():
    # Before: accepted from Python (the CLI's --seed refuses it), every question ran, then the summary's
    # bootstrap failed in numpy with "expected non-negative integer".
    with pytest.raises(ConfigError, match=r"seed=-1: use a whole number in \[0, 2\*\*64\)"):
        BenchSettings(**SMALL, seed=-1)


async def test_a_concurrency_below_one_is_refused_before_anything_runs(index, tmp_path):
    # Before: concurrency=0 made a semaphore no question could take, and the run waited forever.
    model = _model()
    for concurrency in (0, -1):
        with pytest.raises(ConfigError, match=f"concurrency={concurrency}: the questions in flight at once"):
            await run_bench(
                model, index, ITEMS[:1], BenchSettings(**SMALL), tmp_path / "r.jsonl", concurrency=concurrency
            )
    assert not model.calls and not (tmp_path / "r.jsonl").exists()


def test_crossover_is_refused_up_front_naming_where_it_is_measured():
    # Before: accepted, then a crash after the question's rollouts (majority with crossover is an
    # invalid config), or with report methods only N - crossover trajectories and no crossover.
    with pytest.raises(ConfigError, match=r"--set crossover: .*benchmarks/infograph\.py"):
        BenchSettings(**{**SMALL, "extra": {"crossover": 1}})


@pytest.mark.parametrize("stop", [{"early_stop": True}, {"consensus": 0.75}])
def test_stop_settings_are_refused_up_front_naming_where_they_are_measured(stop):
    # Before: accepted, and the partial modes reused the from-scratch samples, which run without
    # stops, so the stop reached only the branches while the table reported it as the setting.
    with pytest.raises(
        ConfigError, match=rf"--set {next(iter(stop))}: .*reuse the from-scratch samples.*online_rollout\.py"
    ):
        BenchSettings(**{**SMALL, "extra": stop})


def test_aggregation_is_refused_up_front_naming_the_methods_flag():
    # Before: accepted and recorded in every result's settings, while each method set its own aggregation.
    with pytest.raises(
        ConfigError, match=r"--set aggregation: .*runs every aggregation method it is asked for: use --methods"
    ):
        BenchSettings(**{**SMALL, "extra": {"aggregation": "majority"}})


@pytest.mark.parametrize("limit", [1, 2])
async def test_max_concurrency_bounds_a_questions_trajectories_and_reports(index, tmp_path, limit):
    # Before: accepted, recorded in the settings and ignored: 4 from-scratch calls, then 6 reports, at once.
    def agent(step, messages):
        return dataclasses.replace(_agent(step, messages), delay=0.01)  # the calls overlap while they wait

    model = ScriptedChatModel(
        responder=research_responder(agent, compress=lambda messages: Reply(report_from_prompt(messages), delay=0.01))
    )
    settings = BenchSettings(**{**SMALL, "extra": {"max_concurrency": limit}})
    (rec,) = await run_bench(model, index, ITEMS[:1], settings, tmp_path / "r.jsonl")
    assert rec["settings"]["extra"] == {"max_concurrency": limit}
    assert rec["methods"]["parallelmuse_exploration"]["answer"] == "Paris" and len(rec["reports"]) == 6
    assert model.peak_in_flight == limit


async def test_a_budget_only_partial_rollout_spends_is_checked_only_when_a_method_runs_it(index, tmp_path):
    # N=2 is below partial rollout's M + k*T = 3, which majority and weighted never spend.
    settings = BenchSettings(**{**SMALL, "n": 2, "methods": ("majority", "weighted")})
    (rec,) = await run_bench(_model(), index, ITEMS[:1], settings, tmp_path / "r.jsonl")
    assert rec["methods"]["majority"]["answer"] == "Paris" and len(rec["methods"]["majority"]["trajectories"]) == 2
    with pytest.raises(ConfigError, match="n=2 < m"):
        BenchSettings(**{**SMALL, "n": 2, "methods": ("majority", "partial")})


async def test_an_interrupted_bench_resumes_without_repeating_a_finished_question(index, tmp_path):
    out = tmp_path / "results.jsonl"
    settings = BenchSettings(**SMALL)
    loop, run = asyncio.get_running_loop(), {}
    # Interrupted (as by Ctrl-C) while question 2 is being answered.
    model = _model(on=ITEMS[1].question, hook=lambda: loop.call_soon_threadsafe(run["task"].cancel))
    run["task"] = asyncio.ensure_future(run_bench(model, index, ITEMS, settings, out))
    with pytest.raises(asyncio.CancelledError):
        await run["task"]
    assert list(load_done(out)) == ["q1"]
    with out.open("a") as fh:
        fh.write('{"id": "q2", "trunc')  # a line cut by the crash

    model = _model()
    records = await run_bench(model, index, ITEMS, settings, out)
    assert [r["id"] for r in records] == ["q1", "q2", "q3"]
    asked = {_question(c["messages"]) for c in model.calls}
    assert asked == {ITEMS[1].question, ITEMS[2].question}  # q1 was not run again
    assert sorted(load_done(out)) == ["q1", "q2", "q3"]
    summary = summarize(records)
    assert summary["majority"]["questions"] == 3 and summary["majority"]["em"][0] == 1.0


async def test_a_question_whose_every_trajectory_failed_is_not_recorded_and_a_rerun_runs_it(
    index, tmp_path, fast_retries
):
    # Before: its record scored every method 0 and a rerun skipped it: a server outage became a result.
    out = tmp_path / "results.jsonl"
    settings = BenchSettings(**SMALL)
    down = _model(on=ITEMS[1].question, hook=_refused)
    message = (
        "1 of 3 question(s) failed and were not recorded: q2: every from-scratch trajectory failed (4 of 4), "
        "the first: model call failed at step 0: ConnectionError: Connection refused. Check that the model's server"
    )
    with pytest.raises(RolloutFailedError, match=re.escape(message)) as failed:
        await run_bench(down, index, ITEMS, settings, out)
    assert [r["id"] for r in failed.value.result["records"]] == ["q1", "q3"]  # the others went on
    assert list(failed.value.result["failed"]) == ["q2"]
    assert sorted(load_done(out)) == ["q1", "q3"]
    model = _model()
    records = await run_bench(model, index, ITEMS, settings, out)
    assert [r["id"] for r in records] == ["q1", "q2", "q3"]
    assert {_question(c["messages"]) for c in model.calls} == {ITEMS[1].question}
    assert records[1]["methods"]["majority"]["em"] == 1.0


def _judge(*, down_on: str | None = None) -> ScriptedChatModel:
    """A judge that says yes, or whose server refuses the prompts about question ``down_on`` (a refusal
    of those prompts, as a content filter's: the judge is up for the other questions)."""

    def reply(messages):
        refused = RuntimeError("HTTP 400: the prompt was refused")
        return refused if down_on and down_on in messages[-1].content else "correct: yes"

    return ScriptedChatModel(responder=reply)


async def test_a_question_whose_judge_failed_is_not_recorded_and_a_rerun_judges_it(index, tmp_path):
    # Before: the JudgeError escaped and cancelled the questions in flight, their rollouts lost.
    out = tmp_path / "results.jsonl"
    settings = BenchSettings(**SMALL)
    judge = _judge(down_on=ITEMS[1].question)
    with pytest.raises(RolloutFailedError) as failed:
        await run_bench(_model(), index, ITEMS, settings, out, concurrency=3, judge=judge)
    said = str(failed.value)
    assert said.startswith(
        "1 of 3 question(s) failed and were not recorded: "
        "q2: the LLM judge failed: RuntimeError: HTTP 400: the prompt was refused."
    )
    assert "Check that the judge's server is up (--judge-base-url, --judge-model), then rerun" in said
    assert "model's server" not in said
    assert [r["id"] for r in failed.value.result["records"]] == ["q1", "q3"]  # the others went on
    assert list(failed.value.result["failed"]) == ["q2"]
    assert sorted(load_done(out)) == ["q1", "q3"]
    model = _model()
    records = await run_bench(model, index, ITEMS, settings, out, concurrency=3, judge=_judge())
    assert [r["id"] for r in records] == ["q1", "q2", "q3"]
    assert {_question(c["messages"]) for c in model.calls} == {ITEMS[1].question}
    assert records[1]["methods"]["majority"]["judge"] == 1.0


async def test_once_the_judge_is_unreachable_no_further_question_runs_its_rollouts(index, tmp_path):
    # Each question ran its whole rollout only to fail at judging, and a rerun ran them all again. A
    # judge that refuses one question's prompt stops nothing (the test above).
    judge = ScriptedChatModel(responder=lambda messages: ConnectionError("Connection refused"))
    model = _model()
    with pytest.raises(RolloutFailedError) as failed:
        await run_bench(model, index, ITEMS, BenchSettings(**SMALL), tmp_path / "r.jsonl", judge=judge)
    assert {_question(c["messages"]) for c in model.calls} == {ITEMS[0].question}
    assert failed.value.result["failed"]["q2"] == "not run: the LLM judge was unreachable on q1"
    assert list(failed.value.result["failed"]) == ["q1", "q2", "q3"]
    assert "Check that the judge's server is up" in str(failed.value)


async def test_a_bench_whose_model_and_judge_failed_says_to_check_both_servers(index, tmp_path, fast_retries):
    judge = _judge(down_on=ITEMS[2].question)
    with pytest.raises(RolloutFailedError) as failed:
        down = _model(on=ITEMS[1].question, hook=_refused)
        await run_bench(down, index, ITEMS, BenchSettings(**SMALL), tmp_path / "r.jsonl", judge=judge)
    said = str(failed.value)
    assert "q2: every from-scratch trajectory failed (4 of 4)" in said and "q3: the LLM judge failed" in said
    assert (
        "Check that the model's server is up (--base-url, --model) and that the judge's server is up "
        "(--judge-base-url, --judge-model), then rerun the same command" in said
    )
    assert [r["id"] for r in failed.value.result["records"]] == ["q1"]


async def test_a_question_whose_every_branch_failed_after_its_samples_is_not_recorded(index, tmp_path, fast_retries):
    # Before: the check counted the from-scratch samples the mode reuses, which had answered, so a server
    # that died after them left every branch, report and aggregation failed and the question recorded.
    out = tmp_path / "results.jsonl"
    agent_calls = []

    def responder(messages):
        if role_of(messages) == "agent":
            agent_calls.append(1)
        if len(agent_calls) > 8:  # 4 from-scratch trajectories of 2 steps, then the server is down
            raise ConnectionError("Connection refused")
        return research_responder(_agent)(messages)

    with pytest.raises(RolloutFailedError) as failed:
        await run_bench(ScriptedChatModel(responder=responder), index, ITEMS[:1], BenchSettings(**SMALL), out)
    said = str(failed.value)
    assert said.startswith(
        "1 of 1 question(s) failed and were not recorded: q1: every exploration partial-rollout branch failed "
        "(2 of 2), the first: model call failed at step "
    )
    assert "ConnectionError: Connection refused. Check that the model's server is up" in said
    assert list(failed.value.result["failed"]) == ["q1"] and load_done(out) == {}
    (rec,) = await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), out)  # the rerun runs it
    assert rec["methods"]["parallelmuse_exploration"]["source"] == "aggregator"


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        ("compress", "q1: every report's model call failed (6 of 6), the first: ConnectionError: Connection refused."),
        (
            "aggregate",
            "q1: the aggregator's model call failed (aggregation_only): ConnectionError: Connection refused.",
        ),
    ],
)
async def test_a_question_whose_reports_or_aggregator_met_a_server_down_is_not_recorded(
    index, tmp_path, fast_retries, stage, message
):
    # Before: recorded, with answer-only reports and the majority vote standing as ParallelMuse's score.
    out = tmp_path / "results.jsonl"
    model = ScriptedChatModel(responder=research_responder(_agent, **{stage: lambda messages: _refused()}))
    with pytest.raises(RolloutFailedError) as failed:
        await run_bench(model, index, ITEMS[:1], BenchSettings(**SMALL), out)
    assert message in str(failed.value) and "Check that the model's server is up" in str(failed.value)
    assert load_done(out) == {}


@pytest.mark.parametrize(
    ("stage", "reply"),
    [
        ("compress", lambda messages: Reply("I will not write sections.")),  # junk: every report falls back
        ("compress", lambda messages: RuntimeError("HTTP 400: the prompt was refused")),  # not an outage
        ("aggregate", lambda messages: RuntimeError("HTTP 400: the prompt was refused")),
    ],
)
async def test_a_report_or_aggregation_that_failed_without_an_outage_is_recorded(index, tmp_path, stage, reply):
    # A rerun would meet the same reply: the fallback is the question's result, as in the graph's run.
    model = ScriptedChatModel(responder=research_responder(_agent, **{stage: reply}))
    (rec,) = await run_bench(model, index, ITEMS[:1], BenchSettings(**SMALL), tmp_path / "r.jsonl")
    assert rec["methods"]["parallelmuse_exploration"]["answer"] == "Paris"
    if stage == "compress":
        assert {r["status"] for r in rec["reports"].values()} == {"fallback"}
    else:
        assert rec["methods"]["parallelmuse_exploration"]["source"] == "majority_fallback"


async def test_a_question_where_some_trajectories_failed_is_recorded_from_the_others(index, tmp_path):
    # The rule of the graph's run (and `ask`): only a set whose every trajectory failed stops.
    calls = []

    def agent(index, messages):
        calls.append(index)
        return RuntimeError("the server dropped this request") if len(calls) == 1 else _agent(index, messages)

    model = ScriptedChatModel(responder=research_responder(agent))
    (rec,) = await run_bench(model, index, ITEMS[:1], BenchSettings(**SMALL), tmp_path / "r.jsonl")
    statuses = [t["status"] for t in rec["trajectories"].values()]
    assert statuses.count("failed") == 1 and statuses.count("answered") == len(statuses) - 1
    assert rec["methods"]["majority"]["answer"] == "Paris"


async def test_a_last_line_cut_inside_a_character_is_run_again_and_dropped(index, tmp_path):
    # Before: read_text() raised UnicodeDecodeError at every later run and --report-only.
    out = tmp_path / "results.jsonl"
    settings = BenchSettings(**SMALL)
    await run_bench(_model(), index, ITEMS[:1], settings, out)
    whole = json.dumps({"id": "q2", "answers": ["Rôme"]}, ensure_ascii=False).encode()
    with out.open("ab") as fh:
        fh.write(whole[: whole.index("ô".encode()) + 1])  # the first byte of a two-byte character
    assert list(load_done(out)) == ["q1"]
    records = await run_bench(_model(), index, ITEMS[:2], settings, out)
    assert [r["id"] for r in records] == ["q1", "q2"]
    # The cut line is gone, not left between two records where it would read as damage.
    assert [json.loads(line)["id"] for line in out.read_bytes().splitlines()] == ["q1", "q2"]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"[]", "an array, not an object"),
        (b"{}", "it has no id"),
        (b'"x"', "a string, not an object"),
        (b'{"id": ["q1"]}', "its id is not a string"),
        (b'{"id": "q1", "settings": 5}', "its settings are not an object"),
        (b'{"id": "q1"}', "missing or not an object: methods, trajectories, reports, picks, timings"),
        # Text that is no cut record: the file is not a bench run's, and nothing may be appended to it.
        (b"notes I keep here", "not JSON"),
    ],
)
async def test_a_results_line_that_is_not_a_record_is_named_with_its_line_and_the_fix(line, problem, index, tmp_path):
    # Before: a raw TypeError or KeyError.
    out = tmp_path / "results.jsonl"
    await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), out)
    record = out.read_bytes()
    named = re.escape(f"{out} line 2 is not a bench question record ({problem}")
    for damaged in (record + line + b"\n" + record, record + line + b"\n"):
        out.write_bytes(damaged)
        with pytest.raises(ConfigError, match=named) as e:
            load_done(out)
        assert "delete the line and its question runs again" in str(e.value)


@pytest.mark.parametrize("line", [b'{"id": "q2", "answers": ["R\xc3', b'{"id": "q2", "ans'])
async def test_a_line_cut_by_a_crash_is_skipped_wherever_it_is(line, index, tmp_path):
    # Versions before this check went on writing after a cut line, so it can sit between records: such
    # a file stopped loading when only a cut last line was allowed. Its question runs again.
    out = tmp_path / "results.jsonl"
    await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), out)
    record = out.read_bytes()
    for damaged in (record + line, record + line + b"\n" + record.replace(b'"q1"', b'"q3"', 1)):
        out.write_bytes(damaged)
        assert sorted(load_done(out)) == (["q1"] if damaged.endswith(line) else ["q1", "q3"])


async def test_continuing_a_bench_with_other_settings_is_refused_not_mixed_into_one_table(index, tmp_path):
    out = tmp_path / "results.jsonl"
    await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), out)
    model = _model()
    with pytest.raises(ConfigError, match=r"question 'q1' run with other settings: n 4 \(now 8\)"):
        await run_bench(model, index, ITEMS, BenchSettings(**{**SMALL, "n": 8}), out)
    assert model.calls == []  # refused before anything ran
    records = await run_bench(model, index, ITEMS[:2], BenchSettings(**SMALL), out)  # the same settings continue
    assert [r["id"] for r in records] == ["q1", "q2"]


async def test_continuing_a_bench_with_a_lower_max_concurrency_proceeds(index, tmp_path):
    # Before: refused ("extra {'max_concurrency': 8} (now {'max_concurrency': 2})"), though how many run at
    # once changes no trajectory and `ask --resume` accepts it (a run lowered after overloading a server).
    out = tmp_path / "results.jsonl"
    await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL, extra={"max_concurrency": 8}), out)
    model = _model()
    records = await run_bench(model, index, ITEMS[:2], BenchSettings(**SMALL, extra={"max_concurrency": 2}), out)
    assert [r["id"] for r in records] == ["q1", "q2"]
    assert {_question(c["messages"]) for c in model.calls} == {ITEMS[1].question}  # q1 was not run again
    assert [r["id"] for r in finished_records(out, ITEMS[:2])] == ["q1", "q2"]  # one table (--report-only)
    assert [r["id"] for r in finished_records(out, ITEMS, settings=BenchSettings(**SMALL))] == ["q1", "q2"]
    # A setting that changes the trajectories is still compared; the scheduling one is not shown.
    with pytest.raises(ConfigError, match=r"other settings: extra \{\} \(now \{'temperature': 0.3\}\); run"):
        finished_records(out, ITEMS, settings=BenchSettings(**SMALL, extra={"temperature": 0.3}))


async def test_a_bench_recorded_with_precision_auto_unresolved_is_continued_as_what_auto_is_here(index, tmp_path):
    """The CLI now records "embedded bfloat16" where it recorded "embedded auto": a folder begun before
    was refused ("run with those settings to continue it"), which no command could do."""
    from langgraph_parallelmuse.models.hardware import resolve_precision

    out = tmp_path / "results.jsonl"
    await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL, model="embedded auto"), out)
    here = BenchSettings(**SMALL, model=f"embedded {resolve_precision('auto')}")
    assert [r["id"] for r in finished_records(out, ITEMS, settings=here)] == ["q1"]
    with pytest.raises(ConfigError, match="other settings: model"):
        finished_records(out, ITEMS, settings=BenchSettings(**SMALL, model="embedded float16"))


async def test_a_record_that_does_not_record_a_setting_is_not_continued(index, tmp_path):
    # Before: a field missing from an older record was never compared, so a served-model run
    # continued a file of the embedded model's records.
    out = tmp_path / "results.jsonl"
    await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), out)
    (rec,) = load_done(out).values()
    del rec["settings"]["model"]
    out.write_text(json.dumps(rec) + "\n")
    model = _model()
    with pytest.raises(
        ConfigError, match=r"'q1' run with other settings: model not recorded \(now 'http://x m'\); choose"
    ):
        await run_bench(model, index, ITEMS, BenchSettings(**SMALL, model="http://x m"), out)
    with pytest.raises(ConfigError, match=r"model not recorded \(now 'embedded'\)"):
        await run_bench(model, index, ITEMS, BenchSettings(**SMALL), out)
    assert model.calls == []


async def test_rollout_table_puts_partial_rollout_beside_from_scratch_sampling(index, tmp_path):
    records = await run_bench(_model(), index, ITEMS[:2], BenchSettings(**SMALL), tmp_path / "r.jsonl")
    lines = rollout_table(records).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| from scratch", "| partial: exploration"]
    scratch, partial = (line.split(" | ") for line in lines[2:])
    assert scratch[2] == "1.000"
    # Two of the four partial trajectories are branches from step 0: same 2-step cost as from
    # scratch, so the ratio is exactly 1 here; their prompts start with the parent's prefix.
    assert partial[2] == "1.000" and partial[3] != "0%"


async def test_rollout_table_reads_the_from_scratch_set_from_any_method_that_runs_on_it(index, tmp_path):
    settings = BenchSettings(**{**SMALL, "methods": ("majority", "parallelmuse")})
    records = await run_bench(_model(), index, ITEMS[:2], settings, tmp_path / "r.jsonl")
    full = await run_bench(_model(), index, ITEMS[:2], BenchSettings(**SMALL), tmp_path / "full.jsonl")
    # Before: without no_scaling the from-scratch row was missing and every ratio was nan.
    rows = rollout_table(records).splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == ["| from scratch", "| partial: exploration"]
    # The same samples as a run with no_scaling: the same row (but the seconds), with the mean
    # single-trajectory scores.
    without_seconds = [c for i, c in enumerate(rows[0].split(" | ")) if i != 6]
    assert without_seconds == [c for i, c in enumerate(rollout_table(full).splitlines()[2].split(" | ")) if i != 6]
    assert rows[0].split(" | ")[2] == "1.000" and "nan" not in rollout_table(records)


async def test_fork_table_counts_each_modes_picks_and_what_their_branches_regenerated(index, tmp_path):
    records = await run_bench(_model(), index, ITEMS[:2], BenchSettings(**SMALL), tmp_path / "r.jsonl")
    assert [r["picks"]["exploration"][0][0] for r in records] == [0, 0]
    rows = fork_table(records).splitlines()[2:]
    # k=1: one pick per question, at the first step (the only search); its 2 branches regenerate
    # the whole two-step trajectory, as many tokens as a from-scratch sample.
    assert rows == ["| exploration | 1 | 2 of 2 | 4 | 1.00 |"]


async def test_an_llm_judge_adds_a_judge_score_to_every_method_and_the_table(index, tmp_path):
    calls = []

    def judge_reply(messages):
        prompt = messages[-1].content
        calls.append(prompt)
        # Says yes only for the exact gold, so a wrong answer must come back as 0.
        response = prompt.split("[response]: ", 1)[1].split("\n", 1)[0]
        return "correct: yes" if response == "Paris" else "correct: no"

    judge = ScriptedChatModel(responder=judge_reply)
    (rec,) = await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), tmp_path / "r.jsonl", judge=judge)
    assert {name: m["judge"] for name, m in rec["methods"].items()} == {name: 1.0 for name in rec["methods"]}
    assert len(calls) == 1  # one call per distinct answer
    table = markdown_table(summarize([rec]))
    assert "| judge |" in table.splitlines()[0]


async def test_an_unreadable_judge_verdict_is_kept_unscored_and_counted_not_scored_wrong(index, tmp_path):
    # Before: llm_judge's None became 0.0, so a judge answering out of format made right answers wrong.
    def judge_reply(messages):
        return "correct: yes" if "[response]: Paris" in messages[-1].content else "Let me think about Rome."

    judge = ScriptedChatModel(responder=judge_reply)
    records = await run_bench(_model(), index, ITEMS[:2], BenchSettings(**SMALL), tmp_path / "r.jsonl", judge=judge)
    rome = records[1]["methods"]
    assert (rome["majority"]["judge"], rome["majority"]["judge_unreadable"]) == (None, 1)
    assert (rome["no_scaling"]["judge"], rome["no_scaling"]["judge_unreadable"]) == (None, 4)  # each trajectory
    assert records[0]["methods"]["majority"]["judge_unreadable"] == 0
    summary = summarize(records)
    # Over the readable verdicts (Paris'), paired over the questions judged in both methods.
    assert summary["majority"]["judge"] == (1.0, 1.0, 1.0) and summary["majority"]["judge_unreadable"] == 1
    assert summary["no_scaling"]["judge_unreadable"] == 4
    assert "judge_vs_majority" not in summary["weighted"]  # one question judged in both: no interval
    assert summary["weighted"]["f1_vs_majority"][:3] == (0.0, 0.0, 0.0)
    head, _, majority = markdown_table(summary).splitlines()[:3]
    assert "| judge | judge unreadable |" in head and majority.split(" | ")[4:6] == ["1.000 [1.00, 1.00]", "1"]
    only_rome = summarize(records[1:])  # no readable verdict at all: no score, not NaN
    assert only_rome["majority"]["judge"] is None and "judge_vs_majority" not in only_rome["weighted"]
    assert markdown_table(only_rome).splitlines()[2].split(" | ")[4:6] == ["—", "1"]


async def test_a_single_trajectory_mean_is_judged_on_its_readable_verdicts():
    from langgraph_parallelmuse.eval.bench import _judge_methods

    verdicts = {"Paris": "correct: yes", "Lyon": "correct: no", "Pariss": "Let me think about it."}

    def judge_reply(messages):
        return verdicts[messages[-1].content.split("[response]: ", 1)[1].split("\n", 1)[0]]

    methods = {"no_scaling": {"answer": None, "trajectories": ["t0", "t1", "t2"]}}
    trajectories = {f"t{i}": {"answer": a} for i, a in enumerate(verdicts)}
    await _judge_methods(ScriptedChatModel(responder=judge_reply), ITEMS[0], methods, trajectories)
    assert (methods["no_scaling"]["judge"], methods["no_scaling"]["judge_unreadable"]) == (0.5, 1)


async def test_records_judged_before_unreadable_verdicts_were_counted_summarise_with_none(index, tmp_path):
    judge = ScriptedChatModel(responder=lambda messages: "correct: yes")
    records = await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), tmp_path / "r.jsonl", judge=judge)
    for entry in records[0]["methods"].values():
        del entry["judge_unreadable"]
    summary = summarize(records)
    assert summary["majority"]["judge_unreadable"] == 0 and summary["majority"]["judge"][0] == 1.0
    assert "| judge unreadable |" in markdown_table(summary)


async def test_a_difference_over_one_question_is_not_claimed_significant(index, tmp_path):
    # Before: the interval of one question's difference was that difference, zero wide: "+1.000 [+1.00, +1.00]".
    settings = BenchSettings(**{**SMALL, "methods": ("majority", "no_scaling")})
    records = await run_bench(_model(), index, ITEMS[:2], settings, tmp_path / "r.jsonl")
    for rec in records:
        rec["methods"]["majority"]["f1"] = 0.0
    one = summarize(records[:1])
    assert "f1_vs_majority" not in one["no_scaling"]
    assert markdown_table(one).splitlines()[-1].split(" | ")[4] == "—"
    assert summarize(records)["no_scaling"]["f1_vs_majority"][:3] == (1.0, 1.0, 1.0)


async def test_a_single_trajectory_mean_costs_one_trajectory_and_an_aggregation_its_aggregator(index, tmp_path):
    """Before, no_scaling was plotted at the cost of all N trajectories, and the aggregator's own
    tokens were counted nowhere."""
    (rec,) = await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), tmp_path / "r.jsonl")
    summary = summarize([rec])
    scratch = rec["methods"]["majority"]["cost"]["generated_tokens"]
    assert summary["majority"]["generated_tokens"] == scratch
    assert summary["no_scaling"]["generated_tokens"] == scratch / 4  # n=4 from-scratch trajectories
    aggregated = rec["methods"]["aggregation_only"]["aggregate_tokens"]
    assert aggregated > 0 and summary["aggregation_only"]["aggregate_tokens"] == aggregated
    assert "aggregate_tokens" not in summary["majority"]


async def test_run_facts_report_the_agent_and_compression_figures(index, tmp_path):
    records = await run_bench(_model(), index, ITEMS[:2], BenchSettings(**SMALL), tmp_path / "r.jsonl")
    facts = run_facts(records)
    assert facts["questions"] == 2 and facts["scratch_trajectories"] == 8
    assert facts["well_formed"] == 1.0 and facts["mean_steps"] == 2.0
    assert facts["aggregations"] == 4 and facts["aggregator_picked"] == 4
    assert facts["reports"] == 12 and 0 < facts["compression_ratio"] and 0 < facts["text_ratio"]


async def test_write_outputs_writes_the_summary_files(index, tmp_path):
    records = await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), tmp_path / "r.jsonl")
    table, drawn = write_outputs(records, tmp_path)
    assert drawn and (tmp_path / "accuracy_vs_tokens.png").stat().st_size > 0
    assert (tmp_path / "uncertainty_profile.png").stat().st_size > 0
    assert (tmp_path / "summary.md").read_text().startswith("| method |")
    assert "| set |" in table and "| fork step |" in table and "- compression_ratio:" in table
    assert "majority" in json.loads((tmp_path / "summary.json").read_text())
    assert set(json.loads((tmp_path / "profile.json").read_text())) >= {"exploration", "reasoning"}


async def test_a_summary_whose_write_fails_leaves_the_earlier_files_whole(index, tmp_path, monkeypatch):
    # Before: written in place, a full disk left summary.md cut.
    records = await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), tmp_path / "r.jsonl")
    write_outputs(records, tmp_path)
    names = ("summary.md", "summary.json", "profile.json")
    before = {name: (tmp_path / name).read_bytes() for name in names}
    write_text = Path.write_text

    def full_disk(self, text, *args, **kwargs):
        write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_outputs(records, tmp_path)
    monkeypatch.undo()
    assert {name: (tmp_path / name).read_bytes() for name in names} == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing half-written is left


async def test_uncertainty_profile_averages_the_from_scratch_steps_only(index, tmp_path):
    (rec,) = await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), tmp_path / "r.jsonl")
    scratch = [t for t in rec["trajectories"].values() if t["origin"]["kind"] in ("initial", "fill")]
    assert len(scratch) < len(rec["trajectories"])  # there are branches, and they must not count
    firsts = [t["uncertainty"][0]["reasoning"] for t in scratch]
    mean, count = uncertainty_profile([rec])["reasoning"][0]
    assert count == len(scratch) and mean == pytest.approx(sum(firsts) / len(firsts))


async def test_a_branch_two_modes_share_is_run_compressed_and_counted_once(index, tmp_path):
    # With k=1, "mixed" picks ceil(1/2)=1 step by exploration: the same checkpoint as "exploration".
    model = _model()
    settings = BenchSettings(**{**SMALL, "modes": ("exploration", "mixed")})
    (rec,) = await run_bench(model, index, ITEMS[:1], settings, tmp_path / "r.jsonl")
    assert rec["picks"]["exploration"] == rec["picks"]["mixed"]
    roles = [role_of(c["messages"]) for c in model.calls]
    # 4 from-scratch trajectories + 2 branches, 2 steps each: the mixed branches were not rerun.
    assert roles.count("agent") == (4 + 2) * 2
    # One report per distinct trajectory (6), shared by both modes' entries.
    assert roles.count("compress") == 6
    assert rec["reports"]["exp.t0.s0.b0"] == rec["reports"]["mix.t0.s0.b0"]
    assert rec["trajectories"]["mix.t0.s0.b0"]["origin"]["region"] == "exploration"
    assert run_facts([rec])["reports"] == 6  # before: 8, the shared branches once per mode


def _questions_file(path, items):
    path.write_text(
        "".join(
            json.dumps(
                {
                    "id": i.id,
                    "question": i.question,
                    "answers": i.answers,
                    "supporting_doc_ids": i.supporting_doc_ids,
                    "context_doc_ids": i.context_doc_ids,
                }
            )
            + "\n"
            for i in items
        )
    )
    return str(path)


async def test_report_only_summarises_the_finished_questions_without_loading_a_model(index, tmp_path, monkeypatch):
    from langgraph_parallelmuse import cli

    out_dir = tmp_path / "run"
    await run_bench(_model(), index, ITEMS[:2], BenchSettings(**SMALL), out_dir / "results.jsonl")

    def no_model(*args, **kwargs):
        raise AssertionError("--report-only loaded a model")

    monkeypatch.setattr(cli, "_model", no_model)
    # Three questions asked, two finished: the summary covers exactly the finished two.
    questions = _questions_file(tmp_path / "q.jsonl", ITEMS)
    argv = ["bench", "--questions", questions, "--out", str(out_dir), "--report-only"]
    assert await asyncio.to_thread(cli.main, argv) == 0
    assert json.loads((out_dir / "summary.json").read_text())["majority"]["questions"] == 2
    assert (out_dir / "summary.md").read_text().startswith("| method |")


async def test_report_only_bootstraps_with_the_runs_own_seed_unless_seed_is_given(index, tmp_path, monkeypatch):
    # Before: the command line's --seed (default 0), whatever seed the run had.
    from langgraph_parallelmuse import cli
    from langgraph_parallelmuse.eval import bench

    out_dir = tmp_path / "run"
    await run_bench(_model(), index, ITEMS[:2], BenchSettings(**SMALL, seed=7), out_dir / "results.jsonl")
    seeds = []

    def write_outputs(records, out_dir, *, seed):
        seeds.append(seed)
        return "| method |", True

    monkeypatch.setattr(bench, "write_outputs", write_outputs)
    argv = ["bench", "--questions", _questions_file(tmp_path / "q.jsonl", ITEMS), "--out", str(out_dir)]
    assert await asyncio.to_thread(cli.main, [*argv, "--report-only"]) == 0
    assert await asyncio.to_thread(cli.main, [*argv, "--report-only", "--seed", "0"]) == 0
    assert seeds == [7, 0]


async def test_report_only_refuses_a_file_that_mixes_settings(index, tmp_path, monkeypatch, capsys):
    # Before: --report-only summarised records of two seeds (or models) as one run, which the
    # run path refuses to write.
    from langgraph_parallelmuse import cli

    out_dir = tmp_path / "run"
    await run_bench(_model(), index, ITEMS[:1], BenchSettings(**SMALL), tmp_path / "seed0.jsonl")
    await run_bench(_model(), index, ITEMS[1:2], BenchSettings(**SMALL, seed=1), tmp_path / "seed1.jsonl")
    out_dir.mkdir()
    (out_dir / "results.jsonl").write_text(
        (tmp_path / "seed0.jsonl").read_text() + (tmp_path / "seed1.jsonl").read_text()
    )
    monkeypatch.setattr(cli, "_model", lambda *a, **k: pytest.fail("--report-only loaded a model"))
    questions = _questions_file(tmp_path / "q.jsonl", ITEMS)
    argv = ["bench", "--questions", questions, "--out", str(out_dir), "--report-only"]
    assert await asyncio.to_thread(cli.main, argv) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert "mixes questions run with different settings: seed 0 (q1), 1 (q2);" in said
    assert "move the lines of each settings to their own output directory" in said
    assert not (out_dir / "summary.json").exists()


async def test_report_only_reads_records_written_before_a_setting_was_recorded(index, tmp_path, monkeypatch):
    # Records from before `model` and `judge` were recorded sit beside later ones of the same run:
    # a field one record lacks is no second value.
    from langgraph_parallelmuse import cli

    out_dir = tmp_path / "run"
    out_dir.mkdir()
    await run_bench(_model(), index, ITEMS[:2], BenchSettings(**SMALL), out_dir / "results.jsonl")
    first, *rest = (out_dir / "results.jsonl").read_text().splitlines()
    old = json.loads(first)
    del old["settings"]["model"], old["settings"]["judge"]
    (out_dir / "results.jsonl").write_text("\n".join([json.dumps(old), *rest]) + "\n")
    monkeypatch.setattr(cli, "_model", lambda *a, **k: pytest.fail("--report-only loaded a model"))
    questions = _questions_file(tmp_path / "q.jsonl", ITEMS[:2])
    argv = ["bench", "--questions", questions, "--out", str(out_dir), "--report-only"]
    assert await asyncio.to_thread(cli.main, argv) == 0
    assert (out_dir / "summary.json").exists()


def test_an_interrupted_bench_command_summarises_what_finished(index, tmp_path, monkeypatch):
    from langgraph_parallelmuse import cli

    run = {}

    def scripted(args, settings=None, **kwargs):
        run["loop"], run["task"] = asyncio.get_running_loop(), asyncio.current_task()
        return _model(on=ITEMS[1].question, hook=lambda: run["loop"].call_soon_threadsafe(run["task"].cancel))

    monkeypatch.setattr(cli, "_model", scripted)
    out_dir = tmp_path / "run"
    argv = ["bench", "--questions", _questions_file(tmp_path / "q.jsonl", ITEMS), "--out", str(out_dir)]
    argv += ["--corpus", str(tmp_path / "corpus.jsonl"), "--n", "4", "--k", "1", "--t", "2", "--modes", "exploration"]
    with pytest.raises(asyncio.CancelledError):
        cli.main(argv)
    assert list(load_done(out_dir / "results.jsonl")) == ["q1"]
    assert json.loads((out_dir / "summary.json").read_text())["majority"]["questions"] == 1


def _bench_argv(tmp_path, *flags: str) -> list[str]:
    """The ``bench`` command over ``ITEMS`` and the ``index`` fixture's corpus, writing ``tmp_path / "run"``."""
    argv = ["bench", "--questions", _questions_file(tmp_path / "q.jsonl", ITEMS), "--out", str(tmp_path / "run")]
    return [*argv, "--corpus", str(tmp_path / "corpus.jsonl"), "--n", "4", "--k", "1", "--t", "2", *flags]


def test_the_bench_command_hashes_its_corpus_once_for_its_records_and_its_index(index, tmp_path, monkeypatch):
    # Before: hashed for the records' settings, then again for the index's cache key (each reads the whole file).
    from langgraph_parallelmuse import cli
    from langgraph_parallelmuse.tools import corpus as corpus_module

    model = _model()
    monkeypatch.setattr(cli, "_model", lambda *args, **kwargs: model)
    hashed = []
    real = corpus_module.file_sha256
    monkeypatch.setattr(corpus_module, "file_sha256", lambda path: hashed.append(path) or real(path))
    assert cli.main(_bench_argv(tmp_path, "--limit", "1", "--methods", "majority")) == 0
    assert hashed == [(tmp_path / "corpus.jsonl").resolve()]


def test_a_bench_continued_on_another_corpus_is_refused_and_one_recorded_before_the_corpus_continues(
    index, tmp_path, monkeypatch, capsys
):
    # Before: --corpus was not in the settings, so a run continued on other texts without a word.
    from langgraph_parallelmuse import cli

    model = _model()
    monkeypatch.setattr(cli, "_model", lambda *args, **kwargs: model)
    other = tmp_path / "other.jsonl"
    texts = [{**d, "text": d["text"].replace("capital", "largest city")} for d in DOCS]  # the same ids
    other.write_text("".join(json.dumps(d) + "\n" for d in texts))
    assert cli.main(_bench_argv(tmp_path, "--limit", "1", "--methods", "majority")) == 0
    calls = len(model.calls)
    first = str(tmp_path / "corpus.jsonl")
    argv = [str(other) if a == first else a for a in _bench_argv(tmp_path, "--limit", "2", "--methods", "majority")]
    assert cli.main(argv) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert re.search(r"corpus 'corpus.jsonl \(\d+ bytes, sha256 \w+\)' \(now 'other.jsonl \(\d+ bytes", said), said
    assert len(model.calls) == calls  # refused before a question ran
    results = tmp_path / "run" / "results.jsonl"
    (old,) = load_done(results).values()
    del old["settings"]["corpus"]  # as written before the corpus was recorded: continued, as then
    results.write_text(json.dumps(old) + "\n")
    assert cli.main(argv) == 0
    assert list(load_done(results)) == ["q1", "q2"]


def test_the_bench_command_summarises_the_finished_questions_and_fails_naming_the_failed_ones(
    index, tmp_path, monkeypatch, capsys, fast_retries
):
    # Before: exit 0, and the failed question was recorded with a score of 0.
    from langgraph_parallelmuse import cli

    monkeypatch.setattr(cli, "_model", lambda *args, **kwargs: _model(on=ITEMS[1].question, hook=_refused))
    assert cli.main(_bench_argv(tmp_path, "--modes", "exploration")) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "q2: failed, not recorded: every from-scratch trajectory failed (4 of 4)" in err
    assert "error: 1 of 3 question(s) failed and were not recorded: q2: every from-scratch trajectory" in err
    assert "ConnectionError: Connection refused" in err and "rerun the same command" in err
    assert list(load_done(tmp_path / "run" / "results.jsonl")) == ["q1", "q3"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["majority"]["questions"] == 2


def test_the_bench_command_summarises_the_finished_questions_and_fails_naming_a_failed_judge(
    index, tmp_path, monkeypatch, capsys
):
    from langgraph_parallelmuse import cli

    monkeypatch.setattr(cli, "_model", lambda *args, **kwargs: _model())
    monkeypatch.setattr(cli, "_judge", lambda args: _judge(down_on=ITEMS[1].question))
    assert cli.main(_bench_argv(tmp_path, "--modes", "exploration")) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "q2: failed, not recorded: the LLM judge failed: RuntimeError: HTTP 400: the prompt was refused" in err
    assert "error: 1 of 3 question(s) failed and were not recorded: q2: the LLM judge failed" in err
    assert "Check that the judge's server is up (--judge-base-url, --judge-model)" in err
    assert list(load_done(tmp_path / "run" / "results.jsonl")) == ["q1", "q3"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["majority"]["questions"] == 2


def test_each_finished_question_shows_the_answer_of_the_first_method_that_has_one(index, tmp_path, monkeypatch, capsys):
    # Before: parallelmuse_exploration's or majority's answer only: answer='' with other methods.
    from langgraph_parallelmuse import cli

    monkeypatch.setattr(cli, "_model", lambda *args, **kwargs: _model())
    assert cli.main(_bench_argv(tmp_path, "--limit", "1", "--methods", "no_scaling,max_tool_calls")) == 0
    assert "q1: gold='Paris' max_tool_calls='Paris' (" in capsys.readouterr().err


def test_the_bench_eta_is_this_runs_pace_from_its_start(index, tmp_path, monkeypatch):
    # Before: Rich kept 30 s of speed samples, less than a question takes: with one question in
    # flight there was never an ETA (and with two, two finishing 2 s apart made it a few seconds).
    from langgraph_parallelmuse import cli

    clock, made, eta = [0.0], [], []
    progress = cli._progress

    def timed(**kwargs):
        made.append(progress(**kwargs))
        made[-1].get_time = lambda: clock[0]
        return made[-1]

    respond = research_responder(_agent)

    def responder(messages):
        if role_of(messages) == "agent":
            if _question(messages) == ITEMS[2].question and not eta:
                eta.append(made[-1].tasks[0].time_remaining)
            clock[0] += 25.0  # 4 trajectories of 2 steps: 200 s a question
        return respond(messages)

    monkeypatch.setattr(cli, "_progress", timed)
    monkeypatch.setattr(cli, "_model", lambda *args, **kwargs: ScriptedChatModel(responder=responder))
    argv = _bench_argv(tmp_path, "--methods", "majority")
    assert cli.main([*argv, "--limit", "1"]) == 0
    assert cli.main(argv) == 0  # q1 resumed, then q2 in 200 s: q3 will take as long
    assert eta == [200]


def _raise(messages):
    raise RuntimeError("aggregator down")


@pytest.mark.parametrize(
    ("aggregate", "source"),
    [
        (None, "aggregator"),
        (lambda messages: Reply("I cannot decide."), "majority_fallback"),  # no usable answer
        (_raise, "majority_fallback"),
    ],
)
async def test_the_bench_and_the_graph_choose_the_same_answer_on_the_same_trajectories(index, aggregate, source):
    """One Stage 2: the bench's ParallelMuse entry is the graph's own map and reduce, fallbacks included."""
    from langgraph_parallelmuse.eval.bench import run_question
    from langgraph_parallelmuse.graph import create_parallelmuse
    from langgraph_parallelmuse.tools import make_corpus_tools

    def model():
        kwargs = {} if aggregate is None else {"aggregate": aggregate}
        return ScriptedChatModel(responder=research_responder(_agent, **kwargs))

    item = ITEMS[0]
    settings = BenchSettings(**SMALL, methods=("parallelmuse",))
    tools = make_corpus_tools(index, doc_ids=item.context_doc_ids)
    rec = await run_question(model(), tools, item, settings)
    out = await create_parallelmuse(model(), tools, config=settings.config("exploration")).ainvoke(
        {"question": item.question}
    )
    bench = rec["methods"]["parallelmuse_exploration"]
    assert (bench["answer"], bench["source"]) == (out["answer"], out["answer_source"]) == ("Paris", source)
    assert sorted(r["answer"] for r in rec["reports"].values()) == sorted(r["answer"] for r in out["reports"])


def test_a_bench_without_a_corpus_is_refused_before_a_model_loads_naming_the_corpus_beside_the_questions(
    tmp_path, monkeypatch
):
    from langgraph_parallelmuse import cli

    monkeypatch.setattr(cli, "_model", lambda *args, **kwargs: pytest.fail("a model was loaded"))
    questions = _questions_file(tmp_path / "dev.questions.jsonl", ITEMS)
    (tmp_path / "dev.corpus.jsonl").write_text("")
    with pytest.raises(ConfigError, match=r"bench needs --corpus.*--corpus .*dev\.corpus\.jsonl"):
        asyncio.run(cli._bench(cli.build_parser().parse_args(["bench", "--questions", questions])))


async def test_questions_naming_documents_not_in_the_corpus_are_refused_before_any_model_call(index, tmp_path):
    # A questions file beside the wrong corpus used to run: every search found nothing, recall was 0.
    # (The open setting is not checked: it may search another corpus than the gold's, e.g. a dump.)
    setting = "distractor"
    other = [
        QAItem("h1", "Who?", ["x"], ["5a8b57f25542995d1e6f1371"], ["5a8b57f25542995d1e6f1371", "d1"], "hotpotqa"),
        QAItem("h2", "Where?", ["y"], ["5ab3b0bf5542992ade7c6e39"], ["d2"], "hotpotqa"),
    ]
    model = _model()
    out = tmp_path / "r.jsonl"
    with pytest.raises(CorpusError) as excinfo:
        await run_bench(model, index, [ITEMS[0], *other], BenchSettings(**SMALL, setting=setting), out)
    message = str(excinfo.value)
    for name in ("'h1'", "'h2'", "'5a8b57f25542995d1e6f1371'", "'5ab3b0bf5542992ade7c6e39'", "corpus.jsonl"):
        assert name in message
    assert "'q1'" not in message and "'d1'" not in message
    assert model.calls == []
    assert not out.exists()


async def test_the_distractor_setting_refuses_questions_without_context_doc_ids(index, tmp_path):
    model = _model()
    bare = QAItem("q9", "What is the capital of France?", ["Paris"], [], [], "toy")
    with pytest.raises(CorpusError, match=r"'q9'.*no context_doc_ids.*--setting open"):
        await run_bench(model, index, [bare], BenchSettings(**SMALL), tmp_path / "r.jsonl")
    assert model.calls == []
    # The open setting runs it; with no supporting documents recall is unavailable, not 0.
    settings = BenchSettings(**SMALL, setting="open", methods=("majority",))
    records = await run_bench(model, index, [bare], settings, tmp_path / "r.jsonl")
    assert {t["recall_seen"] for t in records[0]["trajectories"].values()} == {None}
    table, _ = write_outputs(records, tmp_path)
    assert "- recall_seen: n/a (no question lists supporting_doc_ids)" in table


def test_documents_seen_are_the_hits_left_in_the_observation_and_the_pages_opened():
    """The agent cuts an observation at max_observation_chars: the ids of hits cut off were counted
    as seen. A visited page counts whatever its text shows (its own URL may lie past the cut)."""
    from langgraph_parallelmuse.eval.bench import documents_seen

    traj = {
        "observations": [
            {"name": "search", "content": "[1] A (id: d12)\nx\n\n[2] B (id: d1", "doc_ids": ["d12", "d1"]},
            {"name": "visit", "content": "Eiffel Tower\n\nA tower … …[truncated]", "doc_ids": ["https://w/Eiffel"]},
        ]
    }
    assert documents_seen(traj) == ["d12", "https://w/Eiffel"]
    assert documents_seen(traj, "visit") == ["https://w/Eiffel"]


async def test_each_online_mode_of_the_bench_takes_its_own_forks(tmp_path):
    """Every mode shared one run id, and online branching replays the forks an earlier run of its id
    took: the reasoning mode forked where exploration had, under exploration's region."""
    from langgraph_parallelmuse.agent import RolloutRunner
    from langgraph_parallelmuse.eval import bench
    from tests.unit.fakes import make_tools

    calibration = tmp_path / "cal.json"
    calibration.write_text(
        json.dumps({"estimator": "nll", "quantile": 0.8, "thresholds": {"exploration": 3.0, "reasoning": 3.0}})
    )
    steps = [
        Reply(call_text("search", "look it up", query="capital of France"), regions={"tool_call": -2.5}),
        Reply(call_text("visit", "open it", doc="Paris")),
        Reply(call_text("search", "not sure which", query="France capital city"), regions={"think": -2.5}),
        Reply(answer_text("Paris")),
    ]
    runner = RolloutRunner(
        ScriptedChatModel(responder=research_responder(lambda i, m: steps[min(i, 3)])), make_tools()[0]
    )
    settings = bench.BenchSettings(
        n=3,
        k=1,
        t=1,
        modes=("exploration", "reasoning"),
        methods=("parallelmuse",),
        extra={"branching": "online", "calibration": str(calibration)},
    )
    item = QAItem(
        id="q1",
        question="What is the capital of France?",
        answers=["Paris"],
        supporting_doc_ids=[],
        context_doc_ids=[],
        dataset="x",
    )
    picks = (await bench._rollouts(runner, item, settings, note=lambda s: None)).picks
    assert [p[:2] for p in picks["exploration"]] == [[0, "exploration"]]
    assert [p[:2] for p in picks["reasoning"]] == [[2, "reasoning"]]


async def test_a_results_file_that_cannot_be_written_is_refused_before_any_question_runs(index, tmp_path, monkeypatch):
    # Before: the first question's rollouts ran, then its record failed to append (a raw PermissionError).
    out = tmp_path / "results.jsonl"
    opened = Path.open

    def read_only(self, mode="r", *args, **kwargs):
        if self == out and "a" in mode:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return opened(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", read_only)
    calls = []
    with pytest.raises(ConfigError, match=re.escape(f"cannot write the results file {out} (Permission denied)")):
        await run_bench(
            _model(on="France", hook=lambda: calls.append(1)), index, ITEMS[:1], BenchSettings(**SMALL), out
        )
    assert calls == []


async def test_a_record_that_cannot_be_appended_names_the_file_and_keeps_the_finished_ones(index, tmp_path):
    from langgraph_parallelmuse.eval import bench

    with pytest.raises(ConfigError, match=r"cannot append question 'q1' to /dev/full \(No space left on device\)"):
        bench._append(Path("/dev/full"), {"id": "q1"})


async def test_a_record_holding_a_lone_surrogate_is_kept_escaped(tmp_path):
    # Before: UnicodeEncodeError after the question's whole run, and the record was lost.
    from langgraph_parallelmuse.eval import bench

    out = tmp_path / "results.jsonl"
    bench._append(out, {"id": "q1", "answer": "caf\udce9"})
    assert json.loads(out.read_bytes()) == {"id": "q1", "answer": "caf\udce9"}


async def test_a_cut_last_line_is_dropped_and_the_user_told_which_question_runs_again(index, tmp_path):
    out = tmp_path / "results.jsonl"
    settings = BenchSettings(**SMALL)
    await run_bench(_model(), index, ITEMS[:1], settings, out)
    with out.open("ab") as fh:
        fh.write(b'{"id": "q2", "question": "What is the capi')
    said: list[str] = []
    records = await run_bench(_model(), index, ITEMS[:2], settings, out, log=said.append)
    assert [r["id"] for r in records] == ["q1", "q2"]
    assert f"line 2 of {out} was cut off by a crash: dropped, question 'q2' runs again" in said[0]


def test_a_cut_last_line_whose_id_is_not_utf8_is_dropped_without_a_crash(tmp_path):
    # Before: UnicodeDecodeError out of naming the question, after the line was dropped.
    from langgraph_parallelmuse.eval import bench

    out = tmp_path / "results.jsonl"
    out.write_bytes(b'{"id": "q\xff1", "question": "What is the capi')
    assert bench._drop_cut_line(out).endswith("dropped, its question runs again")
    assert out.read_bytes() == b""
