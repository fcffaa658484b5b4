"""From a row's logits to the request's next token, text, logprob entry and stop state.

Log-probabilities are *raw*: ``log_softmax`` of the unwarped logits, before temperature and top-p.
Text is produced incrementally by decoding a short window that ends at the new tokens, so the
pieces concatenate to the decoded whole even for tokenizers that drop a leading space per call.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import torch

from langgraph_parallelmuse.models.requests import GenerationRequest, RequestState

__all__ = ["Decoder", "byte_decoder", "choose", "eos_ids"]

_TOP_P_HEAD = 512
_GREEDY_BELOW = 1e-5
# A SentencePiece byte-fallback piece: one byte of a character the vocabulary has no piece for.
_BYTE_PIECE = re.compile(r"<0x([0-9A-F]{2})>")


def byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE alphabet: character -> byte (printable bytes map to themselves).

    Example:
        >>> decoder = byte_decoder()
        >>> decoder["A"], decoder["Ġ"]
        (65, 32)
    """
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(visible)
    extra = 0
    for b in range(256):
        if b not in visible:
            visible.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(visible, codes, strict=True)}


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """End-of-sequence ids named by the model's generation config, its config and the tokenizer."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        ids.update(value if isinstance(value, list | tuple) else [value])
    ids.add(tokenizer.eos_token_id)
    return frozenset(i for i in ids if i is not None)


def _byte_level(tokenizer: Any) -> bool:
    """Whether the tokenizer spells its pieces in :func:`byte_decoder`'s alphabet (GPT-2, SmolLM2, Llama 3).

    Its piece for the space byte, ``"Ġ"``, decodes to a space; a SentencePiece vocabulary has no
    such piece (or one that decodes to itself).
    """
    space = tokenizer.convert_tokens_to_ids("Ġ")
    return isinstance(space, int) and tokenizer.decode([space]) == " "


def choose(logits: torch.Tensor, requests: Sequence[GenerationRequest], generators: Sequence[Any]) -> list[int]:
    """Each row's next token from float32 logits ``[rows, vocab]``: greedy at temperature 0, else nucleus.

    One softmax and one top-k serve every sampled row; each row then draws with its own generator.

    Example:
        >>> import torch
        >>> logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
        >>> choose(logits, [GenerationRequest([1], temperature=0.0)] * 2, [None, None])
        [1, 0]
    """
    tokens = logits.argmax(dim=-1).tolist()
    # Below this a row's logits / temperature overflow to inf and its NaN would fail the whole
    # batch's draw; sampling that cold is greedy anyway.
    sampled = [i for i, r in enumerate(requests) if r.temperature > _GREEDY_BELOW]
    if not sampled:
        return tokens
    rows = torch.tensor(sampled)
    temperature = torch.tensor([requests[i].temperature for i in sampled], dtype=logits.dtype)
    probs = torch.softmax(logits.index_select(0, rows) / temperature[:, None], dim=-1)
    # A full sort of the vocabulary dominated the decode step; the nucleus almost always lies
    # within the top few hundred tokens, so sort only those unless it does not.
    head, order = torch.topk(probs, min(_TOP_P_HEAD, probs.shape[-1]), dim=-1)
    covered = head.sum(dim=-1).tolist()
    for j, i in enumerate(sampled):
        top_p = requests[i].top_p
        if top_p >= 1.0:
            tokens[i] = int(torch.multinomial(probs[j], 1, generator=generators[i]))
            continue
        row_head, row_order = (head[j], order[j]) if covered[j] >= top_p else torch.sort(probs[j], descending=True)
        # Keep the smallest head whose mass reaches top_p, and always the first token (top_p = 0
        # is greedy, as in vLLM: masking every token would fail the whole batch's step).
        cut = (torch.cumsum(row_head, dim=-1) - row_head) >= top_p
        cut[0] = False
        row_head = row_head.masked_fill(cut, 0.0)
        tokens[i] = int(row_order[torch.multinomial(row_head, 1, generator=generators[i])])
    return tokens


class Decoder:
    """Turns each row's logits into the request's next token, text piece and logprob entry.

    Args:
        tokenizer: The model's tokenizer (token strings, decoding).
        eos: End-of-sequence token ids.

    Example:
        >>> from langgraph_parallelmuse.models.loading import load_model
        >>> tokenizer = load_model().tokenizer  # doctest: +SKIP
        >>> Decoder(tokenizer, frozenset({2})).token_info(tokenizer("Hi").input_ids[0])  # doctest: +SKIP
        ('Hi', [72, 105])
    """

    def __init__(self, tokenizer: Any, eos: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.eos = eos
        # SentencePiece pieces ("▁the", "<0x0A>") are not spelled in the byte-level alphabet, though
        # plain ASCII ones look as if they were: read that way, "<0x0A>" would be its six letters.
        self._bytes_of_char = byte_decoder() if _byte_level(tokenizer) else None
        # A token decoded after this keeps the leading space a SentencePiece decoder strips from the
        # start of the text.
        self._anchor = list(tokenizer("a", add_special_tokens=False).input_ids)
        self._anchor_chars = len(self.decode(self._anchor))
        self.token_info = functools.lru_cache(maxsize=65536)(self._token_info)

    def _token_info(self, token_id: int) -> tuple[str, list[int]]:
        """A token's own text and bytes (byte-level and byte-fallback pieces map to their exact bytes)."""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        raw = self._spelled_bytes(piece) if isinstance(piece, str) else None
        if raw is not None:
            return bytes(raw).decode("utf-8", errors="replace"), raw
        text = self.decode([*self._anchor, token_id])[self._anchor_chars :]
        return text, list(text.encode("utf-8"))

    def _spelled_bytes(self, piece: str) -> list[int] | None:
        """The bytes a piece spells: byte-level characters, or a SentencePiece byte ``<0xNN>``."""
        if self._bytes_of_char is not None:
            if all(ch in self._bytes_of_char for ch in piece):
                return [self._bytes_of_char[ch] for ch in piece]
            return None
        if (byte := _BYTE_PIECE.fullmatch(piece)) is not None:
            return [int(byte[1], 16)]
        return None

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens and spacing kept as they are."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def step(self, seqs: Sequence[RequestState], logits: torch.Tensor) -> None:
        """Choose every row's next token from its raw logits ``[rows, vocab]`` and update its state."""
        logits = logits.float()
        tokens = choose(logits, [s.req for s in seqs], [s.generator for s in seqs])
        for i, seq in enumerate(seqs):
            if seq.req.forced_ids:
                tokens[i] = seq.req.forced_ids[len(seq.gen)]
        wanted = [s.req.logprobs for s in seqs]
        chosen: list[float] = []
        top_values: list[list[float]] = []
        top_ids: list[list[int]] = []
        if any(wanted):
            logp = torch.log_softmax(logits, dim=-1)
            chosen = logp.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
            top = max(s.req.top_logprobs for s, w in zip(seqs, wanted, strict=True) if w)
            if top:
                values, ids = torch.topk(logp, top, dim=-1)
                top_values, top_ids = values.tolist(), ids.tolist()
        for i, seq in enumerate(seqs):
            alternatives = []
            if top_ids and seq.req.logprobs:
                k = seq.req.top_logprobs
                alternatives = list(zip(top_values[i][:k], top_ids[i][:k], strict=True))
            self._advance(seq, tokens[i], chosen[i] if chosen else 0.0, alternatives)
            if seq.req.on_text is not None:
                _stream(seq)

    def _advance(self, seq: RequestState, token: int, logprob: float, alternatives: list[tuple[float, int]]) -> None:
        req = seq.req
        if token in self.eos and not (req.ignore_eos or req.forced_ids):
            before = len(seq.text)
            self._flush(seq)
            # The flushed text (a token's own characters before its partial one) may end a stop string.
            _cut_at_stop(seq, before)
            seq.finish = "stop"
            return
        seq.gen.append(token)
        piece = self._next_piece(seq)
        final = len(seq.gen) >= seq.max_new
        if piece.endswith("\ufffd") and not final:
            piece = ""  # an incomplete UTF-8 character: its text comes with the next token
        else:
            seq.pending_from = len(seq.gen)
        if req.logprobs:
            seq.entries.append(self._entry(token, logprob, piece, alternatives))
            seq.starts.append(len(seq.text))
        before = len(seq.text)
        seq.text += piece
        if _cut_at_stop(seq, before):
            seq.finish = "stop"
            return
        if final:
            seq.finish = "length"

    def _flush(self, seq: RequestState) -> None:
        """Add the text of an incomplete UTF-8 character the generation ends in ("\ufffd", as a length
        cut keeps it), so the token ids and the text (and the logprob entries' tokens) agree."""
        if seq.pending_from == len(seq.gen):
            return
        piece = self._next_piece(seq)
        seq.pending_from = len(seq.gen)
        if seq.req.logprobs and seq.entries:
            seq.entries[-1] = {**seq.entries[-1], "token": seq.entries[-1]["token"] + piece}
        seq.text += piece

    def _next_piece(self, seq: RequestState) -> str:
        # Decode a short window ending at the new tokens: the text between two decodes that
        # share their start is exact even for tokenizers that drop a leading space per call.
        ids = seq.context + seq.gen
        done = len(seq.context) + seq.pending_from
        start = max(0, done - 4)
        return self.decode(ids[start:])[len(self.decode(ids[start:done])) :]

    def _entry(self, token: int, logprob: float, piece: str, alternatives: list[tuple[float, int]]) -> dict[str, Any]:
        tops = []
        for value, tid in alternatives:
            text, raw = self.token_info(tid)
            tops.append({"token": text, "logprob": value, "bytes": raw})
        return {"token": piece, "logprob": logprob, "bytes": self.token_info(token)[1], "top_logprobs": tops}


def _stream(seq: RequestState) -> None:
    """Pass ``seq``'s new text to its ``on_text``, all but the tail a stop string may still begin in.

    An error the callback raises fails this request alone: it ends here (its KV is still sound, so
    the batch caches it as a finished row's) and its future holds the error. Raised out of the
    decode step, it failed every request of the batch.
    """
    if seq.future.done():  # failed by an earlier piece: a scored request's later tokens stream no more
        return
    end = len(seq.text)
    if seq.finish is None and seq.req.stop:
        # A stop string found later ends past the current text, so it starts in its last longest-1 characters.
        end -= max(0, max(len(s) for s in seq.req.stop) - 1)
    if end > seq.streamed:
        try:
            seq.req.on_text(seq.text[seq.streamed : end])
        except Exception as exc:  # noqa: BLE001 - the caller's code: reported through its own future
            seq.finish = "stop"
            seq.future.set_exception(exc)
            return
        seq.streamed = end


def _cut_at_stop(seq: RequestState, before: int) -> bool:
    """Cut ``seq``'s text before the first stop string that ends in its text past ``before``; whether one did."""
    req = seq.req
    if not req.stop or req.forced_ids or len(seq.text) == before:
        return False
    at = _find_stop(seq.text, req.stop, before)
    if at is not None:
        cut(seq, at)
    return at is not None


def _find_stop(text: str, stops: Sequence[str], before: int) -> int | None:
    """Earliest start of a stop string that ends after offset ``before`` (new text), or ``None``."""
    longest = max(len(s) for s in stops)
    window = max(0, before - longest + 1)
    cuts = [i for s in stops if s and (i := text.find(s, window)) >= 0]
    return min(cuts) if cuts else None


def cut(seq: RequestState, at: int) -> None:
    """Cut ``seq``'s text at offset ``at``; entries past it go, the one it falls into is trimmed."""
    seq.text = seq.text[:at]
    if not seq.req.logprobs:
        return
    kept = []
    for entry, start in zip(seq.entries, seq.starts, strict=True):
        if start >= at:
            break
        if start + len(entry["token"]) > at:
            # The stop string begins inside this token: keep its logprob, trim its text.
            entry = {**entry, "token": seq.text[start:at]}
            entry["bytes"] = list(entry["token"].encode("utf-8"))
        kept.append(entry)
    seq.entries = kept
