"""One normaliser for token logprobs from every backend.

OpenAI / vLLM chat (``{"content": [{token, logprob, bytes, top_logprobs}]}``), OpenAI-style
completions (``{tokens, token_logprobs, top_logprobs, text_offset}``), llama.cpp's native
``completion_probabilities`` (old ``probs``/``tok_str`` and new ``logprob``/``top_logprobs``
forms), and our in-process model (the OpenAI chat shape) all become one list of
:class:`~langgraph_parallelmuse.state.TokenRecord` with character offsets into the generated text,
so functional regions (char spans of protocol tags) can be mapped onto tokens.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from langgraph_parallelmuse.errors import ProtocolError
from langgraph_parallelmuse.state import TokenRecord

MAX_TOP_LOGPROBS = 20


def top_logprobs_problem(value: object) -> str | None:
    """What is wrong with a ``top_logprobs`` setting, or ``None``: the one check every layer uses.

    The OpenAI API allows 0 to 20 alternatives per token and the servers follow it.

    Example:
        >>> top_logprobs_problem(16) is None, top_logprobs_problem(32)
        (True, 'top_logprobs=32: use 0..20 (the OpenAI API limit)')
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        return f"top_logprobs={value!r}: use 0..{MAX_TOP_LOGPROBS} (the OpenAI API limit)"
    return None


# vLLM reports -inf (or this sentinel) for tokens outside the kept vocabulary.
_FLOOR = -9999.0


def _number(value: Any, what: str) -> float:
    """``value`` as a float, not NaN (a NaN would make every later comparison false)."""
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ProtocolError(f"{what} {value!r} is not a number") from None
    if math.isnan(out):
        raise ProtocolError(f"{what} is NaN")
    return out


def checked_logprob(value: Any) -> float:
    """A logprob as a float in ``[-9999, 0]``: a number, not NaN, no lower than the floor servers
    use for -inf, and no higher than 0 (a probability is at most 1; a positive or +inf logprob, a
    server's rounding or a broken payload, would turn the entropy estimate into ``inf - inf``).

    Example:
        >>> checked_logprob("-0.5"), checked_logprob(float("-inf")), checked_logprob(float("inf"))
        (-0.5, -9999.0, 0.0)
    """
    return min(max(_number(value, "logprob"), _FLOOR), 0.0)


def _prob_logprob(value: Any) -> float:
    """The logprob of a probability (old llama.cpp sends probabilities, not logs); 0 gives the floor."""
    p = _number(value, "prob")
    return checked_logprob(math.log(p)) if p > 0 else _FLOOR


def _token_text(entry: Mapping[str, Any]) -> str:
    for key in ("token", "tok_str", "content"):
        if isinstance(entry.get(key), str):
            return entry[key]
    raise ProtocolError(f"token entry has no token text: keys {sorted(entry)}")


def _tops(raw: Any) -> list[list[Any]]:
    if raw is None:
        return []
    if isinstance(raw, Mapping):  # completions API: {token: logprob}
        pairs = [[str(t), checked_logprob(lp)] for t, lp in raw.items()]
    else:
        pairs = []
        for alt in raw:
            if not isinstance(alt, Mapping):
                raise ProtocolError(f"top_logprobs entry {alt!r} is not an object")
            if "logprob" in alt:
                lp = checked_logprob(alt["logprob"])
            elif "prob" in alt:  # old llama.cpp: probabilities, not logs
                lp = _prob_logprob(alt["prob"])
            else:
                raise ProtocolError("top_logprobs entry has neither logprob nor prob")
            pairs.append([_token_text(alt), lp])
    pairs.sort(key=lambda pair: -pair[1])
    return pairs


def _entries(payload: Any) -> list[tuple[str, float, list[list[Any]], bytes | None]]:
    """Flatten any supported payload into (token, logprob, tops, raw bytes or None)."""
    if payload is None:
        return []
    if isinstance(payload, Mapping):
        if "content" in payload and (payload["content"] is None or isinstance(payload["content"], list)):
            items = payload["content"] or []
        elif "completion_probabilities" in payload:
            items = payload["completion_probabilities"] or []
        elif "tokens" in payload and "token_logprobs" in payload:
            tokens, lps = payload["tokens"], payload["token_logprobs"]
            tops = payload.get("top_logprobs") or [None] * len(tokens)
            if not (len(tokens) == len(lps) == len(tops)):
                raise ProtocolError("completions logprobs: tokens, token_logprobs, top_logprobs differ in length")
            return [(str(t), checked_logprob(lp), _tops(tp), None) for t, lp, tp in zip(tokens, lps, tops, strict=True)]
        else:
            raise ProtocolError(f"unknown logprobs payload with keys {sorted(payload)}")
    elif isinstance(payload, Sequence) and not isinstance(payload, (str, bytes)):
        items = payload
    else:
        raise ProtocolError(f"logprobs payload of type {type(payload).__name__} is not supported")
    out = []
    for entry in items:
        if not isinstance(entry, Mapping):
            raise ProtocolError(f"logprob entry {entry!r} is not an object")
        text = _token_text(entry)
        if "logprob" in entry:
            lp = checked_logprob(entry["logprob"])
        elif "probs" in entry:  # old llama.cpp: the sampled token's prob is among its candidates
            cands = {c.get("tok_str"): _prob_logprob(c.get("prob")) for c in entry["probs"] if isinstance(c, Mapping)}
            # Not among them: less likely than each listed one, so the least listed bounds it (the
            # floor alone made one such token the most uncertain step of its trajectory).
            lp = cands.get(text, min((q for q in cands.values() if q > _FLOOR), default=_FLOOR))
        else:
            raise ProtocolError("logprob entry has neither 'logprob' nor 'probs'")
        tops = _tops(entry.get("top_logprobs", entry.get("probs")))
        raw = entry.get("bytes")
        raw_bytes = (
            bytes(raw) if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw) else None
        )
        out.append((text, lp, tops, raw_bytes))
    return out


# What a token holding part of a multi-byte character decodes to, alone (vLLM sends it as the token,
# with the replacement character's bytes; its prompt logprobs' decoded tokens are the same).
SPLIT_CHAR = "\ufffd"


def _parts(pieces: Sequence[str]) -> list[str]:
    """The token strings joined, split into literal text and runs of :data:`SPLIT_CHAR` marks."""
    return [part for part in re.split(f"({SPLIT_CHAR}+)", "".join(pieces)) if part]


# A run of marks fits several lengths of text, so the ends of the ways to spell the tokens add up
# where the text repeats (a repetition loop "哈哈…" has hundreds): only this many, the nearest to the
# start, are followed. A way that needed a farther one is not found (then the sent bytes stand).
_MAX_ENDS = 16


def _spellings(parts: Sequence[str], text: str) -> list[dict[int, int]]:
    """Where each way of spelling ``parts`` from the start of ``text`` ends: for the start and after
    each part, every text position reached, with where the part that reached it began (the first way
    found, for each end; of one part's ends the :data:`_MAX_ENDS` nearest to the start).

    A mark is 1 to 3 bytes (an incomplete character, or one byte that cannot start one), so a run
    of n marks is n to 3n bytes of non-ASCII characters: where a literal character after a run
    repeats in the text, the run takes only as many characters as its marks allow. Each end keeps
    only where its part began (:func:`_runs` follows them back): a copy of the runs so far for each
    end made a long repetitive text cubic.
    """
    steps: list[dict[int, int]] = [{0: 0}]
    for part in parts:
        after: dict[int, int] = {}
        for at in steps[-1]:
            if not part.startswith(SPLIT_CHAR):
                if text.startswith(part, at):
                    after.setdefault(at + len(part), at)
                continue
            size, end = 0, at
            # Lone surrogates have no UTF-8 bytes: no run stands for one.
            while end < len(text) and ord(text[end]) > 0x7F and not 0xD800 <= ord(text[end]) < 0xE000:
                size, end = size + len(text[end].encode()), end + 1
                if size > 3 * len(part):
                    break
                if size >= len(part):
                    after.setdefault(end, at)
        # Bounded, the nearest kept: a repetition loop aligns with them (tests/unit/test_logprobs.py).
        steps.append(dict(sorted(after.items())[:_MAX_ENDS]) if len(after) > _MAX_ENDS else after)
    return steps


def _runs(steps: Sequence[dict[int, int]], parts: Sequence[str], text: str, end: int) -> list[str]:
    """The characters each run of marks in ``parts`` stood for, on the way :func:`_spellings` found
    to ``end``."""
    runs = []
    for part, began in zip(reversed(parts), reversed(steps[1:]), strict=True):
        at = began[end]
        if part.startswith(SPLIT_CHAR):
            runs.append(text[at:end])
        end = at
    return runs[::-1]


def piece_bytes(pieces: Sequence[str], text: str) -> list[bytes] | None:
    """The UTF-8 bytes of each token when the token strings ``pieces`` spell ``text``, else ``None``.

    A run of n :data:`SPLIT_CHAR` marks stands for the non-ASCII characters of n to 3n bytes there
    (see :func:`_spellings`). Which of those bytes each token of the run held is not sent: they are
    spread evenly over the run's marks, so the bytes join to ``text`` and each token of a run covers
    a character of it (every token of a run that is one character covers that character). Where
    the runs fit the text in many ways (a repetition loop of split characters), the ways that give
    each run the fewest characters are followed.

    Example:
        >>> piece_bytes(["D", "\ufffd", "\ufffd", "sseldorf"], "Düsseldorf")
        [b'D', b'\\xc3', b'\\xbc', b'sseldorf']
        >>> piece_bytes(["a", "\ufffd"], "ab") is None
        True
        >>> len(piece_bytes(["哈\ufffd", "\ufffd\ufffd"] * 100, "哈" * 200))  # a repetition loop
        200
    """
    parts = _parts(pieces)
    steps = _spellings(parts, text)
    if len(text) not in steps[-1]:
        return None
    owner = [i for i, piece in enumerate(pieces) for _ in piece]  # the token of each character of the strings
    out = [b"" for _ in pieces]
    at, runs = 0, iter(_runs(steps, parts, text, len(text)))
    for part in parts:
        if part.startswith(SPLIT_CHAR):
            data, n = next(runs).encode(), len(part)
            chunks = [data[k * len(data) // n : (k + 1) * len(data) // n] for k in range(n)]
        else:
            chunks = [char.encode() for char in part]
        for k, chunk in enumerate(chunks):
            out[owner[at + k]] += chunk
        at += len(part)
    return out


def normalize_logprobs(payload: Any, text: str | None = None) -> list[TokenRecord]:
    """Turn any supported logprobs payload into token records with char offsets.

    Offsets come from the tokens' UTF-8 bytes when given (a multi-byte character can be split
    across tokens, whose ``token`` strings then hold replacement characters), else from the token
    strings. When ``text`` is given the tokens are aligned to it; tokens that run past its end
    (e.g. a stop string the server dropped from the text) are clipped. When the tokens' bytes (or
    strings) do not spell ``text`` because split characters came as U+FFFD with the replacement
    character's own bytes (vLLM's chat logprobs), each run of them is matched to the characters it
    stands for (:func:`piece_bytes`), so later tokens keep their offsets.

    Args:
        payload: ``response_metadata["logprobs"]`` of a chat model, or a completions/llama.cpp
            logprobs object, or a bare list of token entries. ``None`` gives ``[]``.
        text: The generated text the tokens belong to.

    Returns:
        One record per token: ``token``, raw ``logprob``, ``top_logprobs`` as ``[token, logprob]``
        pairs best first, and ``start``/``end`` char offsets (every token of a character split
        across tokens covers that character).

    Raises:
        ProtocolError: The payload has an unknown shape or non-numeric logprobs.

    Example:
        >>> recs = normalize_logprobs({"content": [
        ...     {"token": "<th", "logprob": -0.1, "top_logprobs": []},
        ...     {"token": "ink>", "logprob": -0.2, "top_logprobs": []}]}, "<think>")
        >>> [(r["token"], r["start"], r["end"]) for r in recs]
        [('<th', 0, 3), ('ink>', 3, 7)]
    """
    try:
        entries = _entries(payload)
    except ProtocolError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
        raise ProtocolError(f"malformed logprobs payload: {type(exc).__name__}: {exc}") from None
    records: list[TokenRecord] = []
    raws = _byte_pieces(entries, text)
    if raws is not None:
        # Byte-accurate offsets. A token starts where the complete characters before it end and
        # ends after any character it touches, so each token of a split character covers it.
        spans = _char_spans(b"".join(raws))
        done = touched = at = 0  # characters ending at or before ``at``; characters starting before it
        for (token, lp, tops, _), raw in zip(entries, raws, strict=True):
            while done < len(spans) and spans[done][1] <= at:
                done += 1
            start = done
            at += len(raw)
            while touched < len(spans) and spans[touched][0] < at:
                touched += 1
            end = max(start, touched)
            records.append(TokenRecord(token=token, logprob=lp, top_logprobs=tops, start=start, end=end))
    else:
        pos = 0
        for token, lp, tops, _ in entries:
            records.append(TokenRecord(token=token, logprob=lp, top_logprobs=tops, start=pos, end=pos + len(token)))
            pos += len(token)
    if text is not None:
        limit = len(text)
        for rec in records:
            rec["start"] = min(rec["start"], limit)
            rec["end"] = min(rec["end"], limit)
    return records


def _byte_pieces(
    entries: list[tuple[str, float, list[list[Any]], bytes | None]], text: str | None
) -> list[bytes] | None:
    """Each token's UTF-8 bytes: as sent, unless the tokens do not spell ``text`` and their strings
    hold split-character marks; then read from the text (``None``: no bytes, offsets by strings)."""
    sent = [raw for *_, raw in entries]
    raws = sent if entries and all(raw is not None for raw in sent) else None
    pieces = [token for token, *_ in entries]
    spelled = b"".join(raws).decode("utf-8", errors="replace") if raws is not None else "".join(pieces)
    if text is None or spelled.startswith(text) or SPLIT_CHAR not in "".join(pieces):
        return raws
    return _realigned(pieces, text) or raws


def _realigned(pieces: list[str], text: str) -> list[bytes] | None:
    """:func:`piece_bytes` for tokens that may run past ``text``: the server drops a stop string
    from the text but not its tokens. Only a tail after the last split character may be dropped."""
    joined = "".join(pieces)
    tail = joined[joined.rfind(SPLIT_CHAR) + 1 :]
    ends = _spellings(_parts([joined[: len(joined) - len(tail)]]), text)[-1]
    at = min((end for end in ends if tail.startswith(text[end:])), default=None)  # the longest kept tail
    return None if at is None else piece_bytes(pieces, text[:at] + tail)


def _char_spans(data: bytes) -> list[tuple[int, int]]:
    """The byte span of each character of ``data`` decoded as the text is (``errors="replace"``:
    each maximal invalid subpart one U+FFFD), in one pass: decoding every token's prefix again made
    offsets quadratic in the reply's length (20,000 split characters took 16 s).

    Example:
        >>> _char_spans("aü".encode() + b"\\xe4\\xbd" + b"x")
        [(0, 1), (1, 3), (3, 5), (5, 6)]
    """
    spans, at = [], 0
    for char in data.decode("utf-8", errors="replace"):
        size = len(char.encode())
        if char == SPLIT_CHAR and data[at : at + size] != char.encode():
            try:  # a replacement: the invalid subpart the decoder replaced, which starts here
                data[at : at + 4].decode("utf-8")
            except UnicodeDecodeError as exc:
                size = exc.end
        spans.append((at, at + size))
        at += size
    return spans


def shift(records: list[TokenRecord], offset: int) -> list[TokenRecord]:
    """Move token offsets by ``offset`` chars (a segment placed inside a longer step text)."""
    return [TokenRecord(**{**rec, "start": rec["start"] + offset, "end": rec["end"] + offset}) for rec in records]


def tokens_in_span(records: Sequence[TokenRecord], span: Sequence[int]) -> list[TokenRecord]:
    """Tokens that overlap the char span ``[start, end)`` (a tag split over tokens is handled)."""
    start, end = span
    return [r for r in records if r["end"] > start and r["start"] < end]
