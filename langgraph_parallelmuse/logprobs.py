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


def checked_logprob(value: Any) -> float:
    """A logprob as a float: a number, not NaN, and no lower than the floor servers use for -inf.

    Example:
        >>> checked_logprob("-0.5"), checked_logprob(float("-inf"))
        (-0.5, -9999.0)
    """
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ProtocolError(f"logprob {value!r} is not a number") from None
    if math.isnan(out):
        raise ProtocolError("logprob is NaN")
    return max(out, _FLOOR)


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
                p = checked_logprob(alt["prob"])
                lp = math.log(p) if p > 0 else _FLOOR
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
            cands = {c.get("tok_str"): checked_logprob(c.get("prob")) for c in entry["probs"] if isinstance(c, Mapping)}
            # Not among them: less likely than each listed one, so the least listed bounds it (the
            # floor alone made one such token the most uncertain step of its trajectory).
            p = cands.get(text, min((q for q in cands.values() if q > 0), default=0.0))
            lp = math.log(p) if p > 0 else _FLOOR
        else:
            raise ProtocolError("logprob entry has neither 'logprob' nor 'probs'")
        tops = _tops(entry.get("top_logprobs", entry.get("probs")))
        raw = entry.get("bytes")
        raw_bytes = (
            bytes(raw) if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw) else None
        )
        out.append((text, lp, tops, raw_bytes))
    return out


def normalize_logprobs(payload: Any, text: str | None = None) -> list[TokenRecord]:
    """Turn any supported logprobs payload into token records with char offsets.

    Offsets come from the tokens' UTF-8 bytes when given (a multi-byte character can be split
    across tokens, whose ``token`` strings then hold replacement characters), else from the token
    strings. When ``text`` is given the tokens are aligned to it; tokens that run past its end
    (e.g. a stop string the server dropped from the text) are clipped.

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
    if all(raw is not None for *_, raw in entries) and entries:
        # Byte-accurate offsets. A token starts where the complete characters before it end and
        # ends after any character it touches, so each token of a split character covers it.
        whole, at = b"".join(raw for *_, raw in entries), 0
        for token, lp, tops, raw in entries:
            start = _chars_before(whole, at)
            at += len(raw)
            end = max(start, len(whole[:at].decode("utf-8", errors="replace")))
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


def _chars_before(data: bytes, at: int) -> int:
    """How many characters of ``data`` (decoded as the text is, an invalid byte sequence as one
    U+FFFD) end at or before byte ``at``: the characters of ``data[:at]``, less the last when it
    is the valid start of a character that the byte at ``at`` goes on with. Each lead byte allows
    its own range next (after E0 only A0-BF, after ED only 80-9F), so ``decode`` decides.
    """
    before = data[:at]
    count = len(before.decode("utf-8", errors="replace"))
    # A valid but incomplete character is at most 3 bytes: its lead byte and up to 2 more.
    lead = next((p for p in range(at - 1, max(at - 3, 0) - 1, -1) if not 0x80 <= before[p] < 0xC0), None)
    if lead is None or at == len(data) or _utf8(before[lead:]) != "start":
        return count
    return count - (_utf8(before[lead:] + data[at : at + 1]) != "invalid")


def _utf8(data: bytes) -> str:
    """What ``data`` is as UTF-8: ``whole`` characters, the valid ``start`` of one, or ``invalid``."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "start" if exc.reason == "unexpected end of data" else "invalid"
    return "whole"


def shift(records: list[TokenRecord], offset: int) -> list[TokenRecord]:
    """Move token offsets by ``offset`` chars (a segment placed inside a longer step text)."""
    return [TokenRecord(**{**rec, "start": rec["start"] + offset, "end": rec["end"] + offset}) for rec in records]


def tokens_in_span(records: Sequence[TokenRecord], span: Sequence[int]) -> list[TokenRecord]:
    """Tokens that overlap the char span ``[start, end)`` (a tag split over tokens is handled)."""
    start, end = span
    return [r for r in records if r["end"] > start and r["start"] < end]
