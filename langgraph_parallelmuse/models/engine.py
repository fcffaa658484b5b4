"""In-process inference engine: one worker thread, prefix KV reuse and continuous batching.

Requests are submitted from any thread or event loop and answered through a
:class:`concurrent.futures.Future`. The worker owns the model. Each admitted request first reuses
the longest cached prefix of its prompt from a :class:`~.prefix_cache.PrefixCache` and prefills only
the rest (batch size 1, so every request may hit a different cached length); its KV is then
left-padded into the running batch, which is decoded jointly one token per step with per-row
attention masks, position ids, sampling settings and stop strings. Requests arriving while a batch
runs join it at the next step; finished rows leave it at once. Prompt KV is inserted into the
prefix cache right after prefill (so sibling branches admitted in the same step already share it)
and prompt + generated KV again when a request finishes.

Log-probabilities are *raw*: ``log_softmax`` of the unwarped logits, before temperature and top-p.
"""

from __future__ import annotations

import atexit
import functools
import queue
import random
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from langgraph_parallelmuse.errors import InputError
from langgraph_parallelmuse.models.prefix_cache import PrefixCache

__all__ = [
    "GenerationRequest",
    "GenerationResult",
    "InferenceEngine",
    "shared_engine",
]

_PREFILL_CHUNK = 2048
_TOP_P_HEAD = 512
_live_engines: weakref.WeakSet[InferenceEngine] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # A worker still blocked in the queue at interpreter teardown makes torch's thread pool abort
    # ("terminate called without an active exception"); stop the workers first.
    for engine in list(_live_engines):
        engine.close()


@dataclass(frozen=True)
class GenerationRequest:
    """One completion request over token ids.

    Attributes:
        prompt_ids: Prompt token ids (already chat-templated).
        max_new_tokens: Upper bound on generated tokens.
        temperature: Sampling temperature; ``0`` means greedy.
        top_p: Nucleus sampling mass (applied after temperature).
        seed: Seed of this request's private RNG; ``None`` draws a fresh one.
        stop: Stop strings; the text is cut before the earliest occurrence.
        logprobs: Return per-token raw logprobs.
        top_logprobs: How many alternatives per token (0-20), best first.
        ignore_eos: Keep generating past end-of-sequence tokens (benchmarks).

    Example:
        >>> GenerationRequest([1, 2, 3], max_new_tokens=8, temperature=0.0).temperature
        0.0
    """

    prompt_ids: Sequence[int]
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int | None = None
    stop: Sequence[str] = ()
    logprobs: bool = True
    top_logprobs: int = 0
    ignore_eos: bool = False


@dataclass
class GenerationResult:
    """What a request produced.

    Attributes:
        text: Generated text, cut before the first stop string.
        token_ids: Generated token ids (including a token that a stop string cut into).
        logprobs: OpenAI-shaped entries ``{"token", "logprob", "bytes", "top_logprobs"}`` whose
            ``token`` strings concatenate to ``text``; ``None`` if not requested.
        finish_reason: ``"stop"`` (EOS or stop string) or ``"length"``.
        prompt_tokens: Prompt length in tokens.
        cached_tokens: Prompt tokens served from the prefix cache.
    """

    text: str
    token_ids: list[int]
    logprobs: list[dict[str, Any]] | None
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    cached_tokens: int

    @property
    def completion_tokens(self) -> int:
        """Number of generated tokens."""
        return len(self.token_ids)


@dataclass(eq=False)
class _Seq:
    req: GenerationRequest
    future: Future
    prompt: list[int]
    max_new: int
    generator: torch.Generator | None
    context: list[int]
    cached: int = 0
    gen: list[int] = field(default_factory=list)
    pending_from: int = 0
    text: str = ""
    entries: list[dict[str, Any]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    finish: Literal["stop", "length"] | None = None
    pad: int = 0
    batch_cache: Any = None


@functools.cache
def _growable_layer_class() -> type:
    """A ``DynamicLayer`` that appends into spare capacity instead of re-concatenating.

    transformers' ``DynamicLayer`` copies the whole cache on every decode step (``torch.cat``);
    with 8 rows of 1,700 tokens that copy cost more than the model itself on CPU (measured:
    1.5 s vs 0.37 s per step under load). Anything that replaces ``keys``/``values`` from
    outside (row selection, left-pad trimming) is detected and adopted into a fresh buffer.
    """
    from transformers.cache_utils import DynamicLayer

    class GrowableLayer(DynamicLayer):
        _key_buf: torch.Tensor | None = None
        _value_buf: torch.Tensor | None = None

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            keys, n = self.keys, key_states.shape[-2]
            length = keys.shape[-2] if keys.numel() else 0
            buf = self._key_buf
            adopted = (
                buf is not None
                and keys.numel() > 0
                and keys.data_ptr() == buf.data_ptr()
                and keys.shape[0] == buf.shape[0]
            )
            if not adopted or length + n > buf.shape[-2]:
                batch, heads, _, dim = key_states.shape
                capacity = length + n + max(64, (length + n) // 4)
                key_buf = key_states.new_empty(batch, heads, capacity, dim)
                value_buf = value_states.new_empty(batch, heads, capacity, value_states.shape[-1])
                if length:
                    key_buf[..., :length, :] = keys
                    value_buf[..., :length, :] = self.values
                self._key_buf, self._value_buf = key_buf, value_buf
            self._key_buf[..., length : length + n, :] = key_states
            self._value_buf[..., length : length + n, :] = value_states
            self.keys = self._key_buf[..., : length + n, :]
            self.values = self._value_buf[..., : length + n, :]
            return self.keys, self.values

    return GrowableLayer


def _byte_decoder() -> dict[str, int]:
    # GPT-2 byte-level BPE alphabet: printable bytes map to themselves, the rest to U+0100 onward.
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(visible)
    extra = 0
    for b in range(256):
        if b not in visible:
            visible.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(visible, codes, strict=True)}


class InferenceEngine:
    """Owns a causal LM on a worker thread and serves generation requests.

    Args:
        model: A ``transformers`` causal LM (eval mode).
        tokenizer: Its tokenizer (used for EOS ids, token strings and stop-string matching).
        prefix_cache: Reuse KV of cached prompt prefixes.
        batching: Decode concurrent requests in one batch; ``False`` serves one at a time.
        cache_max_bytes: Memory bound of the prefix cache.
        max_batch_size: Most rows decoded together.
        batch_window: Seconds the idle worker waits after a first request for companions.
        name: Display name of the model.

    Example:
        >>> from langgraph_parallelmuse.models.loading import load_model
        >>> loaded = load_model()  # doctest: +SKIP
        >>> engine = InferenceEngine(loaded.model, loaded.tokenizer)  # doctest: +SKIP
        >>> ids = loaded.tokenizer("The capital of France is").input_ids  # doctest: +SKIP
        >>> engine.generate(GenerationRequest(ids, max_new_tokens=4, temperature=0)).text
        ... # doctest: +SKIP
        ' Paris.'
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        prefix_cache: bool = True,
        batching: bool = True,
        cache_max_bytes: int = 2 * 1024**3,
        max_batch_size: int = 8,
        batch_window: float = 0.02,
        name: str = "local",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.batching = batching
        self.max_batch_size = max_batch_size if batching else 1
        self.batch_window = batch_window if batching else 0.0
        self.cache = PrefixCache(cache_max_bytes) if prefix_cache else None
        self.max_context_tokens = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self._eos = self._eos_ids()
        self._bytes_of_char = _byte_decoder()
        self._queue: queue.Queue[tuple[GenerationRequest, Future] | None] = queue.Queue()
        self._stats_lock = threading.Lock()
        self.reset_stats()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"engine-{name}", daemon=True)
        self._thread.start()
        _live_engines.add(self)

    # ------------------------------------------------------------------ public API

    def submit(self, request: GenerationRequest) -> Future[GenerationResult]:
        """Queue a request; the returned future resolves to a :class:`GenerationResult`.

        Raises:
            InputError: The prompt is empty or fills the model's context window.
        """
        if self._closed:
            raise RuntimeError("engine is closed")
        if not request.prompt_ids:
            raise InputError("the prompt is empty: send at least one message")
        if len(request.prompt_ids) >= self.max_context_tokens:
            raise InputError(
                f"the prompt has {len(request.prompt_ids)} tokens but the model's context is "
                f"{self.max_context_tokens}: shorten the messages"
            )
        if not 0 <= request.top_logprobs <= 20:
            raise InputError(f"top_logprobs must be in 0..20, got {request.top_logprobs}")
        future: Future[GenerationResult] = Future()
        self._queue.put((request, future))
        return future

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Submit and wait (convenience for scripts)."""
        return self.submit(request).result()

    def stats(self) -> dict[str, float | int]:
        """Counters since the last :meth:`reset_stats`.

        Keys: ``requests``, ``prefill_tokens_computed``, ``prefill_tokens_reused``,
        ``decode_tokens``, ``batches`` (joint decode steps), ``batch_rows`` (sequences summed
        over those steps), ``mean_batch_size``,
        ``cache_hit_rate`` (share of requests that reused a prefix), ``cache_token_reuse``
        (share of prompt tokens reused), ``cache_bytes``.
        """
        with self._stats_lock:
            s = dict(self._stats)
        prompt = s["prefill_tokens_computed"] + s["prefill_tokens_reused"]
        s["mean_batch_size"] = s["batch_rows"] / s["batches"] if s["batches"] else 0.0
        s["cache_hit_rate"] = s.pop("_hits") / s["requests"] if s["requests"] else 0.0
        s["cache_token_reuse"] = s["prefill_tokens_reused"] / prompt if prompt else 0.0
        s["cache_bytes"] = self.cache.nbytes if self.cache is not None else 0
        return s

    def reset_stats(self) -> None:
        """Zero the counters (the prefix cache itself is kept)."""
        with self._stats_lock:
            self._stats = dict.fromkeys(
                (
                    "requests",
                    "prefill_tokens_computed",
                    "prefill_tokens_reused",
                    "decode_tokens",
                    "batches",
                    "batch_rows",
                    "_hits",
                ),
                0,
            )

    def clear_cache(self) -> None:
        """Drop every prefix-cache entry."""
        if self.cache is not None:
            self.cache.clear()

    def close(self) -> None:
        """Stop the worker after the queued requests are served."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()

    # ------------------------------------------------------------------ worker

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for key, value in deltas.items():
                self._stats[key] += value

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config):
            value = getattr(source, "eos_token_id", None)
            ids.update(value if isinstance(value, list | tuple) else [value])
        ids.add(self.tokenizer.eos_token_id)
        return frozenset(i for i in ids if i is not None)

    def _run(self) -> None:
        active: list[_Seq] = []
        batch: Any = None
        stopping = False
        while not (stopping and not active):
            incoming: list[tuple[GenerationRequest, Future]] = []
            room = self.max_batch_size - len(active)
            if not active:
                item = self._queue.get()
                if item is None:
                    break
                incoming.append(item)
                deadline = time.monotonic() + self.batch_window
                while len(incoming) < room:
                    try:
                        item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                    if item is None:
                        stopping = True
                        break
                    incoming.append(item)
            else:
                while len(incoming) < room and not stopping:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        stopping = True
                    else:
                        incoming.append(item)
            try:
                with torch.inference_mode():
                    admitted = [self._admit(req, fut) for req, fut in incoming]
                    live = []
                    for seq in admitted:
                        if seq is None:
                            continue
                        if seq.finish is None:
                            live.append(seq)
                        else:
                            self._resolve(seq)
                    if live:
                        batch = self._merge(active, batch, live)
                        active = active + live
                    if active:
                        self._decode_step(active, batch)
                        active, batch = self._retire(active, batch)
            except Exception as exc:  # noqa: BLE001 - a failed step must not kill the worker
                for seq in active:
                    if not seq.future.done():
                        seq.future.set_exception(exc)
                active, batch = [], None

    def _admit(self, req: GenerationRequest, fut: Future) -> _Seq | None:
        """Prefill one request from its cached prefix; return it holding its own batch-1 cache."""
        if not fut.set_running_or_notify_cancel():
            return None
        try:
            prompt = list(req.prompt_ids)
            generator = None
            if req.temperature > 0:
                generator = torch.Generator()
                seed = req.seed if req.seed is not None else random.getrandbits(63)
                generator.manual_seed(seed)
            seq = _Seq(
                req=req,
                future=fut,
                prompt=prompt,
                generator=generator,
                max_new=max(0, min(req.max_new_tokens, self.max_context_tokens - len(prompt))),
                context=prompt[-4:],
            )
            hit = self.cache.lookup(prompt, len(prompt) - 1) if self.cache is not None else None
            cache = self._new_cache(hit.state if hit else ())
            seq.cached = hit.length if hit else 0
            logits = None
            for start in range(seq.cached, len(prompt), _PREFILL_CHUNK):
                chunk = torch.tensor([prompt[start : start + _PREFILL_CHUNK]])
                out = self.model(input_ids=chunk, cache=cache, use_cache=True, logits_to_keep=1)
                logits = out.logits[:, -1, :]
            self._count(
                requests=1,
                prefill_tokens_computed=len(prompt) - seq.cached,
                prefill_tokens_reused=seq.cached,
                _hits=int(seq.cached > 0),
            )
            if self.cache is not None:
                self.cache.insert(prompt, self._row_state(cache, 0, 0))
            seq.batch_cache = cache
            if seq.max_new == 0:
                seq.finish = "length"
            else:
                self._consume(seq, logits[0])
            return seq
        except Exception as exc:  # noqa: BLE001 - reported to the caller through its future
            fut.set_exception(exc)
            return None

    def _new_cache(self, state: Sequence[torch.Tensor]) -> Any:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=self.model.config)
        if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
            growable = _growable_layer_class()
            cache.layers = [growable() for _ in cache.layers]
        for i in range(0, len(state), 2):
            cache.layers[i // 2].update(state[i], state[i + 1])
        return cache

    @staticmethod
    def _row_state(cache: Any, row: int, pad: int) -> tuple[torch.Tensor, ...]:
        state = []
        for layer in cache.layers:
            state.append(layer.keys[row : row + 1, :, pad:, :])
            state.append(layer.values[row : row + 1, :, pad:, :])
        return tuple(state)

    def _merge(self, active: list[_Seq], batch: Any, admitted: list[_Seq]) -> Any:
        """Left-pad the running batch cache and the new requests' caches to one length."""
        if batch is None and len(admitted) == 1:
            seq = admitted[0]
            cache, seq.batch_cache, seq.pad = seq.batch_cache, None, 0
            return cache
        rows: list[tuple[Any, int, int]] = []  # (cache, row index, current pad)
        if batch is not None:
            rows.extend((batch, i, s.pad) for i, s in enumerate(active))
        rows.extend((s.batch_cache, 0, 0) for s in admitted)
        lengths = [c.layers[0].keys.shape[-2] - p for c, _, p in rows]
        total = max(lengths)
        state: list[torch.Tensor] = []
        for li in range(len(rows[0][0].layers)):
            keys, values = [], []
            for (c, r, p), n in zip(rows, lengths, strict=True):
                layer = c.layers[li]
                k = layer.keys[r : r + 1, :, p:, :]
                v = layer.values[r : r + 1, :, p:, :]
                pad = total - n
                if pad:
                    k = torch.nn.functional.pad(k, (0, 0, pad, 0))
                    v = torch.nn.functional.pad(v, (0, 0, pad, 0))
                keys.append(k)
                values.append(v)
            state.extend((torch.cat(keys), torch.cat(values)))
        for s, n in zip([*active, *admitted], lengths, strict=True):
            s.pad = total - n
        for s in admitted:
            s.batch_cache = None
        return self._new_cache(state)

    def _decode_step(self, active: list[_Seq], batch: Any) -> None:
        total = batch.layers[0].keys.shape[-2]
        pads = torch.tensor([s.pad for s in active])
        mask = (torch.arange(total + 1)[None, :] >= pads[:, None]).long()
        positions = (total - pads)[:, None]
        input_ids = torch.tensor([[s.gen[-1]] for s in active])
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            cache=batch,
            use_cache=True,
        )
        self._count(batches=1, batch_rows=len(active))
        logits = out.logits[:, -1, :]
        for i, seq in enumerate(active):
            self._consume(seq, logits[i])

    def _retire(self, active: list[_Seq], batch: Any) -> tuple[list[_Seq], Any]:
        """Resolve finished rows, store their KV and drop them from the batch."""
        done = [i for i, s in enumerate(active) if s.finish is not None]
        if not done:
            return active, batch
        for i in done:
            seq = active[i]
            # The last sampled token was never fed, so the KV covers prompt + gen[:-1].
            if self.cache is not None:
                tokens = seq.prompt + seq.gen[:-1]
                state = self._row_state(batch, i, seq.pad)
                if state[0].shape[-2] == len(tokens):
                    self.cache.insert(tokens, state)
            self._resolve(seq)
        keep = [i for i, s in enumerate(active) if s.finish is None]
        if not keep:
            return [], None
        batch.batch_select_indices(torch.tensor(keep))
        survivors = [active[i] for i in keep]
        trim = min(s.pad for s in survivors)
        if trim:
            for layer in batch.layers:
                layer.keys = layer.keys[..., trim:, :]
                layer.values = layer.values[..., trim:, :]
            for s in survivors:
                s.pad -= trim
        return survivors, batch

    # ------------------------------------------------------------------ per-token logic

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - engines live as long as the process
    def _token_info(self, token_id: int) -> tuple[str, list[int]]:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and all(ch in self._bytes_of_char for ch in piece):
            raw = [self._bytes_of_char[ch] for ch in piece]
            text = bytes(raw).decode("utf-8", errors="replace")
            return text, raw
        text = self._decode([token_id])
        return text, list(text.encode("utf-8"))

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _sample(self, seq: _Seq, logits: torch.Tensor) -> int:
        req = seq.req
        if req.temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / req.temperature, dim=-1)
        if req.top_p < 1.0:
            # A full sort of the vocabulary dominated the decode step; the nucleus almost always
            # lies within the top few hundred tokens, so sort only those unless it does not.
            head, order = torch.topk(probs, min(_TOP_P_HEAD, probs.numel()))
            if float(head.sum()) < req.top_p:
                head, order = torch.sort(probs, descending=True)
            # Keep the smallest head whose mass reaches top_p (the first token always survives).
            head = head.masked_fill((torch.cumsum(head, dim=-1) - head) >= req.top_p, 0.0)
            choice = torch.multinomial(head, 1, generator=seq.generator)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=seq.generator))

    def _consume(self, seq: _Seq, logits: torch.Tensor) -> None:
        """Pick the next token for ``seq`` from its raw logits and update text/stop state."""
        logits = logits.float()
        token = self._sample(seq, logits)
        req = seq.req
        if token in self._eos and not req.ignore_eos:
            seq.finish = "stop"
            return
        seq.gen.append(token)
        self._count(decode_tokens=1)
        # Decode a short window ending at the new tokens: the text between two decodes that
        # share their start is exact even for tokenizers that drop a leading space per call.
        ids = seq.context + seq.gen
        done = len(seq.context) + seq.pending_from
        start = max(0, done - 4)
        piece = self._decode(ids[start:])[len(self._decode(ids[start:done])) :]
        final = len(seq.gen) >= seq.max_new
        if piece.endswith("\ufffd") and not final:
            piece = ""  # an incomplete UTF-8 character: its text comes with the next token
        else:
            seq.pending_from = len(seq.gen)
        if req.logprobs:
            logp = torch.log_softmax(logits, dim=-1)
            entry: dict[str, Any] = {
                "token": piece,
                "logprob": float(logp[token]),
                "bytes": self._token_info(token)[1],
                "top_logprobs": [],
            }
            if req.top_logprobs:
                values, ids = torch.topk(logp, req.top_logprobs)
                for value, tid in zip(values.tolist(), ids.tolist(), strict=True):
                    text, raw = self._token_info(tid)
                    entry["top_logprobs"].append({"token": text, "logprob": value, "bytes": raw})
            seq.entries.append(entry)
            seq.starts.append(len(seq.text))
        before = len(seq.text)
        seq.text += piece
        if req.stop and piece:
            longest = max(len(s) for s in req.stop)
            window = max(0, before - longest + 1)
            cuts = [i for s in req.stop if s and (i := seq.text.find(s, window)) >= 0]
            if cuts:
                self._cut(seq, min(cuts))
                seq.finish = "stop"
                return
        if final:
            seq.finish = "length"

    @staticmethod
    def _cut(seq: _Seq, at: int) -> None:
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

    def _resolve(self, seq: _Seq) -> None:
        if seq.future.done():
            return
        seq.future.set_result(
            GenerationResult(
                text=seq.text,
                token_ids=list(seq.gen),
                logprobs=seq.entries if seq.req.logprobs else None,
                finish_reason=seq.finish or "length",
                prompt_tokens=len(seq.prompt),
                cached_tokens=seq.cached,
            )
        )


_engines: dict[tuple, InferenceEngine] = {}
_engines_lock = threading.Lock()


def shared_engine(
    model_path: str | None = None,
    gguf_file: str | None = None,
    *,
    prefix_cache: bool = True,
    batching: bool = True,
    cache_max_bytes: int = 2 * 1024**3,
    max_batch_size: int = 8,
    dtype: str = "float32",
) -> InferenceEngine:
    """Return the process-wide engine for these weights and settings (created on first use).

    Several chat-model instances on the same weights and settings thus share one worker, one
    batch and one prefix cache.

    Example:
        >>> engine = shared_engine()  # doctest: +SKIP
        >>> engine is shared_engine()  # doctest: +SKIP
        True
    """
    from langgraph_parallelmuse.models.loading import load_model

    loaded = load_model(model_path, gguf_file, dtype)
    key = (loaded.path, loaded.gguf_file, dtype, prefix_cache, batching, cache_max_bytes, max_batch_size)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = InferenceEngine(
                loaded.model,
                loaded.tokenizer,
                prefix_cache=prefix_cache,
                batching=batching,
                cache_max_bytes=cache_max_bytes,
                max_batch_size=max_batch_size,
                name=loaded.name,
            )
            _engines[key] = engine
        return engine
