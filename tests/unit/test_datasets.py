"""Dev-set loading: the real shared files, clear errors on bad lines, locating the data folder."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from pathlib import Path

import pytest

from langgraph_parallelmuse.eval import (
    EVAL_DATA_ENV,
    EvalDataError,
    QAItem,
    eval_data_dir,
    load_questions,
)

ROW = {
    "id": "q1",
    "question": "Capital of France?",
    "answers": ["Paris", "City of Light"],
    "supporting_doc_ids": ["d1"],
    "context_doc_ids": ["d1", "d2"],
    "dataset": "toy",
    "split": "dev",
    "meta": {"level": "easy"},
}


def _write(tmp_path: Path, rows: list[object | str]) -> Path:
    path = tmp_path / "toy.questions.jsonl"
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _real_dir() -> Path:
    try:
        return eval_data_dir()
    except FileNotFoundError:
        pytest.skip("../shared/eval-data is not present")


@pytest.mark.parametrize("name", ["hotpotqa_train100", "musique_train100"])
def test_real_files_have_100_questions(name):
    path = _real_dir() / f"{name}.questions.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is not present")
    items = load_questions(path)
    assert len(items) == 100
    assert len({item.id for item in items}) == 100
    for item in items:
        assert item.question and item.answers
        assert item.supporting_doc_ids
        assert set(item.supporting_doc_ids) <= set(item.context_doc_ids)
        assert item.dataset == name.split("_")[0]
    assert len(load_questions(path, limit=5)) == 5


def test_load_round_trip(tmp_path):
    path = _write(tmp_path, [ROW, "", {**ROW, "id": "q2"}])
    items = load_questions(path)
    assert [i.id for i in items] == ["q1", "q2"]
    assert items[0] == QAItem(
        id="q1",
        question="Capital of France?",
        answers=["Paris", "City of Light"],
        supporting_doc_ids=["d1"],
        context_doc_ids=["d1", "d2"],
        dataset="toy",
        meta={"split": "dev", "level": "easy"},
    )
    assert load_questions(path, limit=1)[0].id == "q1"
    assert load_questions(path, limit=0) == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", 'expected an object of "id", "question", "answers", ..., got list: write each object'),
        ({k: v for k, v in ROW.items() if k != "question"}, "'question'"),
        ({**ROW, "answers": []}, "'answers' is empty"),
        ({**ROW, "supporting_doc_ids": "d1"}, "'supporting_doc_ids' must be a list"),
        ({k: v for k, v in ROW.items() if k != "answers"}, "'answers' must be a list"),
        ({**ROW, "context_doc_ids": "d1"}, "'context_doc_ids' must be a list"),
        ({**ROW, "meta": [1]}, "'meta' must be an object"),
    ],
)
def test_bad_line_names_file_line_and_problem(tmp_path, bad, message):
    path = _write(tmp_path, [ROW, bad])
    with pytest.raises(EvalDataError, match=message) as excinfo:
        load_questions(path)
    assert f"{path}:2:" in str(excinfo.value)
    assert isinstance(excinfo.value, ValueError)


def test_a_repeated_id_names_both_lines(tmp_path):
    # Before: accepted; the bench keeps results by id, so a resume reported one question twice.
    path = _write(tmp_path, [ROW, {**ROW, "id": "q2"}, {**ROW, "question": "Capital of Spain?"}])
    with pytest.raises(EvalDataError, match=r":3: duplicate id 'q1' \(also on line 1\): give each question its own id"):
        load_questions(path)


def test_a_file_that_is_not_utf8_names_the_line(tmp_path):
    # Before: a bare UnicodeDecodeError, naming neither the file nor the line.
    path = tmp_path / "latin1.questions.jsonl"
    latin1 = json.dumps({**ROW, "id": "q2", "question": "Capital of Côte d'Ivoire?"}, ensure_ascii=False)
    path.write_text(json.dumps(ROW) + "\n" + latin1 + "\n", encoding="latin-1")
    with pytest.raises(EvalDataError, match="not UTF-8") as excinfo:
        load_questions(path)
    assert f"{path}:2:" in str(excinfo.value) and "save the file as UTF-8" in str(excinfo.value)


def test_bad_line_after_limit_is_not_read(tmp_path):
    path = _write(tmp_path, [ROW, "{not json"])
    assert len(load_questions(path, limit=1)) == 1


def test_missing_file(tmp_path):
    # A library error naming the file: the CLI prints it as one line, not a traceback.
    with pytest.raises(EvalDataError, match=r"absent\.jsonl: no such questions file"):
        load_questions(tmp_path / "absent.jsonl")


def test_env_var_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv(EVAL_DATA_ENV, str(tmp_path))
    assert eval_data_dir() == tmp_path


def test_env_var_pointing_nowhere_is_clear(tmp_path, monkeypatch):
    monkeypatch.setenv(EVAL_DATA_ENV, str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match=EVAL_DATA_ENV):
        eval_data_dir()


def test_default_is_shared_folder_next_to_repo(monkeypatch):
    monkeypatch.delenv(EVAL_DATA_ENV, raising=False)
    repo_root = Path(__file__).resolve().parents[2]
    expected = (repo_root.parent / "shared" / "eval-data").resolve()
    if expected.is_dir():
        assert eval_data_dir() == expected
    else:
        with pytest.raises(FileNotFoundError, match="shared/eval-data"):
            eval_data_dir()


def test_a_plain_qa_set_without_gold_documents_loads_with_empty_lists(tmp_path):
    # README: bench takes any {id, question, answers} QA set (the open setting; recall then n/a).
    path = _write(tmp_path, [{"id": "q1", "question": "Capital of France?", "answers": ["Paris"]}])
    (item,) = load_questions(path)
    assert (item.answers, item.supporting_doc_ids, item.context_doc_ids) == (["Paris"], [], [])


def test_outside_a_checkout_the_error_says_to_set_the_env_var(tmp_path, monkeypatch):
    from langgraph_parallelmuse.eval import datasets

    monkeypatch.delenv(EVAL_DATA_ENV, raising=False)
    installed = tmp_path / "site-packages" / "langgraph_parallelmuse" / "eval" / "datasets.py"
    (tmp_path / "shared" / "eval-data").mkdir(parents=True)  # not a checkout's sibling: not used
    monkeypatch.setattr(datasets, "__file__", str(installed))
    with pytest.raises(FileNotFoundError) as excinfo:
        eval_data_dir()
    message = str(excinfo.value)
    assert f"set {EVAL_DATA_ENV}" in message
    assert "project root" not in message and "site-packages" not in message


_NO_ANSWER = "'answers'.*give at least one real answer"
_NOT_AN_OBJECT = "'meta' must be an object.*leave it out"


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        # Before: accepted; no prediction can match an empty normalised answer, so the question scored
        # 0 for every method and quietly lowered every mean.
        *(("answers", answers, _NO_ANSWER) for answers in ([""], ["  ", "..."], ["The"])),
        # Before: ``or {}`` turned any falsy value into an empty object.
        *(("meta", meta, _NOT_AN_OBJECT) for meta in ([], "", 0, False)),
    ],
)
def test_a_field_that_cannot_be_used_names_its_line(tmp_path, field, value, match):
    path = _write(tmp_path, [ROW, {**ROW, "id": "q2", field: value}])
    with pytest.raises(EvalDataError, match=match) as excinfo:
        load_questions(path)
    assert f"{path}:2:" in str(excinfo.value)


def test_one_real_answer_among_empty_aliases_is_enough(tmp_path):
    path = _write(tmp_path, [{**ROW, "answers": ["", "The Paris"]}])
    assert load_questions(path)[0].answers == ["", "The Paris"]


def test_a_null_meta_or_dataset_is_read_as_absent(tmp_path):
    # Before: a null dataset was stored as the name 'None'.
    path = _write(tmp_path, [{**ROW, "meta": None, "dataset": None}])
    (item,) = load_questions(path)
    assert (item.dataset, item.meta) == ("", {"split": "dev"})


_LONE = "\ud83c"  # half of a surrogate pair: json.dumps writes it as the escape \ud83c


@pytest.mark.parametrize(
    ("changes", "where"),
    [
        ({"question": f"Who sang {_LONE}?"}, "field 'question'"),
        ({"answers": ["Paris", f"Par{_LONE}"]}, "field 'answers'[1]"),
        ({"id": f"q{_LONE}"}, "field 'id'"),
        ({"supporting_doc_ids": [f"d{_LONE}"]}, "field 'supporting_doc_ids'[0]"),
        ({"meta": {"supporting_facts": [[f"Al{_LONE}", 3]]}}, "field 'meta'['supporting_facts'][0][0]"),
        ({"meta": {f"lev{_LONE}": "easy"}}, "a key of field 'meta'"),
    ],
)
def test_a_lone_surrogate_escape_in_any_string_names_the_line_and_field(tmp_path, changes, where):
    # Before: loaded fine; the bench crashed writing its record (ensure_ascii=False) after the
    # whole rollout for that question had run.
    path = _write(tmp_path, [ROW, {**ROW, "id": "q2", **changes}])
    assert "\\ud83c" in path.read_text(encoding="utf-8")
    with pytest.raises(EvalDataError, match="must be valid UTF-8 text") as excinfo:
        load_questions(path)
    message = str(excinfo.value)
    assert f"{path}:2: {where} must be valid UTF-8" in message and "no lone surrogate escapes" in message


def test_a_full_surrogate_pair_escape_loads_as_one_character(tmp_path):
    path = _write(tmp_path, [{**ROW, "question": "Who sang \U0001f3b5?"}])
    assert "\\ud83c\\udfb5" in path.read_text(encoding="utf-8")
    assert load_questions(path)[0].question == "Who sang \U0001f3b5?"


@pytest.mark.parametrize("error", [PermissionError(13, "Permission denied"), OSError(5, "Input/output error")])
def test_a_questions_file_that_cannot_be_read_is_an_eval_data_error_naming_it(tmp_path, monkeypatch, error):
    # Before: the bare PermissionError (OSError) of path.open, a traceback naming no fix.
    path = _write(tmp_path, [ROW])
    real_open = Path.open

    def refusing_open(self, *args, **kwargs):
        if self == path:
            raise error  # as for a file without read permission (the tests may run as root)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refusing_open)
    with pytest.raises(EvalDataError) as excinfo:
        load_questions(path)
    said = str(excinfo.value)
    assert said.startswith(f"{path}: cannot read the questions file ({error.strerror})")
    assert "check its permissions" in said


def test_a_directory_given_as_the_questions_file_is_named_as_one(tmp_path):
    with pytest.raises(EvalDataError, match=rf"^{re.escape(str(tmp_path))}: a directory, not a questions file"):
        load_questions(tmp_path)


def test_a_questions_file_saved_with_a_byte_order_mark_loads(tmp_path):
    # Before: its first line was "not valid JSON (Unexpected UTF-8 BOM ...)".
    path = tmp_path / "bom.questions.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps({**ROW, "id": "q2"}) + "\n", encoding="utf-8-sig")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    assert [item.id for item in load_questions(path)] == ["q1", "q2"]
    assert load_questions(path)[0] == load_questions(_write(tmp_path, [ROW]))[0]


@pytest.mark.parametrize(
    "line",
    [
        '{"id": "q2", "question": "Q?", "answers": ["Paris"], "meta": {"n": ' + "9" * 5000 + "}}",
        '{"id": "q2", "question": "Q?", "answers": ["Paris"], "meta": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}",
    ],
    ids=["a number of 5,000 digits", "arrays nested 100,000 deep"],
)
def test_json_the_parser_refuses_is_reported_with_its_line(tmp_path, line):
    # Before: json.loads's ValueError (int digits limit) or RecursionError came out as a bare
    # traceback that named neither the file nor the line.
    path = _write(tmp_path, [ROW, line])
    with pytest.raises(EvalDataError, match="refuses") as excinfo:
        load_questions(path)
    assert f"{path}:2:" in str(excinfo.value)


def test_null_document_lists_are_read_as_absent(tmp_path):
    # Before: "field 'supporting_doc_ids' must be a list of strings, got None", while a null meta
    # or dataset was read as absent; answers stays required.
    path = _write(tmp_path, [{**ROW, "supporting_doc_ids": None, "context_doc_ids": None}])
    item = load_questions(path)[0]
    assert item.supporting_doc_ids == [] and item.context_doc_ids == []
    with pytest.raises(EvalDataError, match="'answers' must be a list"):
        load_questions(_write(tmp_path, [{**ROW, "answers": None}]))


def test_a_pipe_is_read_as_a_questions_file(tmp_path):
    # Before: a FIFO, `--questions <(head -20 f.jsonl)` or /dev/stdin was "no such questions file".
    fifo = tmp_path / "questions.fifo"
    os.mkfifo(fifo)
    lines = json.dumps(ROW) + "\n" + json.dumps({**ROW, "id": "q2"}) + "\n"

    def write() -> None:
        with contextlib.suppress(BrokenPipeError):  # the reader gave up: the test fails on its own
            fifo.write_text(lines, encoding="utf-8")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        assert [item.id for item in load_questions(fifo)] == ["q1", "q2"]
    finally:
        if writer.is_alive():  # nothing opened the pipe: open it, so the writer's open returns
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(timeout=10)


def test_the_package_exports_the_error_llm_judge_raises():
    # Before: llm_judge documented JudgeError, which only eval.judge exported.
    import langgraph_parallelmuse.eval as eval_package
    from langgraph_parallelmuse.eval.judge import JudgeError

    assert eval_package.JudgeError is JudgeError and "JudgeError" in eval_package.__all__


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("id", 7, "field 'id' must be a non-empty string, got 7: write \"7\""),
        ("id", None, "field 'id' is missing"),
        ("question", ["Who?"], "field 'question' must be a non-empty string, got ['Who?']"),
        ("question", "  ", "field 'question' must be a non-empty string, got '  '"),
    ],
)
def test_an_id_or_question_that_is_not_text_says_what_it_is(tmp_path, field, value, said):
    """An id given as a number (``"id": 7``, common in a hand-made set) was reported "missing or empty"."""
    path = _write(tmp_path, [{**ROW, field: value}])
    with pytest.raises(EvalDataError) as excinfo:
        load_questions(path)
    assert str(excinfo.value) == f"{path}:1: {said}"


@pytest.mark.parametrize("key", ["answers", "supporting_doc_ids", "context_doc_ids"])
def test_a_bare_string_for_a_list_is_named_with_the_list_to_write(tmp_path, key):
    # Before: "must be a list of strings, got 'Paris'", without the fix.
    path = _write(tmp_path, [{**ROW, key: "Paris"}])
    with pytest.raises(
        EvalDataError,
        match=re.escape(f"{path}:1: field '{key}' must be a list of strings, got 'Paris': write [\"Paris\"]"),
    ):
        load_questions(path)


def test_a_json_error_at_the_end_of_a_line_gives_its_column(tmp_path):
    # Before: "not valid JSON (Expecting ',' delimiter at column 1)": the column counted from the line end
    # json.loads was given.
    cut = json.dumps(ROW)[:-1]
    path = _write(tmp_path, [ROW, cut])
    with pytest.raises(
        EvalDataError, match=rf":2: not valid JSON \(Expecting ',' delimiter at column {len(cut) + 1}\)"
    ):
        load_questions(path)


@pytest.mark.parametrize("end", ["\r", "\r\n"], ids=["CR only", "CRLF"])
def test_old_mac_and_windows_line_ends_keep_the_line_numbers(tmp_path, end):
    # A guard: the text-mode reader read CR and CRLF line ends; the JSONL reader shared with the corpus must too.
    path = tmp_path / "toy.questions.jsonl"
    rows = [json.dumps({**ROW, "id": f"q{n}"}) for n in range(3)]
    path.write_bytes(end.join([*rows, "", "{oops"]).encode())
    with pytest.raises(EvalDataError, match=r"questions\.jsonl:5: not valid JSON"):
        load_questions(path)
    assert [item.id for item in load_questions(path, limit=3)] == ["q0", "q1", "q2"]


@pytest.mark.parametrize(
    ("doc_id", "fix"),
    [(" d1", 'write "d1"'), ("", "drop it"), ("  ", "drop it")],
    ids=["spaces around", "empty", "blank"],
)
def test_a_document_id_no_corpus_can_hold_is_refused(tmp_path, doc_id, fix):
    # The corpus refuses such ids, so the question's gold or context documents could never be found.
    path = _write(tmp_path, [{**ROW, "context_doc_ids": ["d2", doc_id]}])
    with pytest.raises(
        EvalDataError, match=rf":1: field 'context_doc_ids' holds the id {re.escape(repr(doc_id))}.*: {fix}"
    ):
        load_questions(path)
