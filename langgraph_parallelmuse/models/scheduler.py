"""The engine's worker loop: admission, batch membership and retirement of requests.

Each admitted request first reuses the longest cached prefix of its prompt from the
:class:`~.prefix_cache.PrefixCache` (views, no copy) and prefills only the rest; the requests
admitted together are prefilled in shared forward passes, and their prompt KV goes into the prefix
cache at once. A request that shares a longer prefix with another one being admitted than the
cache holds waits one round for it, so sibling branches of a new prompt compute it once.
The requests admitted together then join the running batch (:mod:`.kv_batch`) by the prefix-cache
entries that now cover their prompts, so siblings read one copy of their common prefix, and the
batch is decoded jointly one token per step. Requests arriving while a batch runs join it at the
next step; finished rows leave it at once, and their prompt + generated KV goes into the cache.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import queue
import random
import threading
import time
from concurrent.futures import CancelledError

import torch

from langgraph_parallelmuse.models.decoding import Decoder
from langgraph_parallelmuse.models.kv_batch import BatchKV
from langgraph_parallelmuse.models.prefix_cache import PrefixCache, PrefixMatch
from langgraph_parallelmuse.models.requests import GenerationRequest, RequestFuture, RequestState
from langgraph_parallelmuse.models.runner import ModelRunner

__all__ = ["COUNTERS", "Counters", "Scheduler", "release_freed_memory", "seeded_generator"]

#: Counter names of :class:`Counters` (``_hits``: requests that reused a prefix).
COUNTERS = (
    "requests",
    "prefill_tokens_computed",
    "prefill_tokens_reused",
    "decode_tokens",
    "scored_tokens",
    "batches",
    "batch_rows",
    "_hits",
    "cancelled",  # requests dropped because their caller cancelled them while they were served
    # Worker time in nanoseconds: admitting requests (prefill, cache insert, joining the batch) and
    # decoding the running batch (forward pass and sampling).
    "_prefill_ns",
    "_decode_ns",
)

Item = tuple[GenerationRequest, RequestFuture] | None

# Seconds between two returns of freed heap memory to the system (see release_freed_memory).
_TRIM_EVERY = 5.0

# Tokens a pending request must share with one being prefilled, beyond its cache hit, to wait for
# it: below that, computing the shared part twice in the same pass costs less than another pass.
_SHARED_ENOUGH = 64


@functools.cache
def _malloc_trim() -> object | None:
    """glibc's ``malloc_trim``, or ``None`` on other C libraries."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)


def release_freed_memory() -> bool:
    """Return the heap memory freed tensors left behind to the system (glibc ``malloc_trim``).

    KV tensors of many sizes come and go (batch rows, prefix-cache entries) while long-lived ones
    sit between them, so the holes they leave stay resident: without this a long bench grew by
    gigabytes above the live tensors. Returns whether a trim ran.

    Example:
        >>> release_freed_memory() in (True, False)
        True
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator whose stream depends on every bit of ``seed`` (an integer in ``[0, 2**64)``).

    torch's ``manual_seed`` seeds a CPU generator's Mersenne Twister from the seed's low 32 bits
    only (seeds 5 and 5 + 2**32 drew the same samples), so a larger seed sets the twister's state
    whole: the state Python's ``random`` seeds from all of its bits. Seeds below 2**32 keep the
    stream ``manual_seed`` gives them.

    Example:
        >>> draw = lambda seed: torch.rand(2, generator=seeded_generator(seed)).tolist()
        >>> draw(5) == draw(5), draw(5) == draw(5 + 2**32)
        (True, False)
    """
    generator = torch.Generator()
    generator.manual_seed(seed)
    if seed >> 32:
        words = random.Random(seed).getstate()[1][:624]
        state = generator.get_state()
        # torch's serialised CPU state: the seed (8 bytes), ``left`` and ``seeded`` (4 each), ``next``
        # (8), then the 624 words as 8-byte integers. ``left`` = 1, as manual_seed leaves it, makes
        # the first draw regenerate them, as Python's first draw does.
        state[24 : 24 + 624 * 8] = torch.tensor(words, dtype=torch.int64).view(torch.uint8)
        generator.set_state(state)
    return generator


class Counters:
    """Thread-safe integer counters, written by the worker and read by any thread.

    Example:
        >>> counters = Counters()
        >>> counters.add(requests=2)
        >>> counters.snapshot()["requests"]
        2
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def add(self, **deltas: int) -> None:
        """Add ``deltas`` to the named counters."""
        with self._lock:
            for key, value in deltas.items():
                self._values[key] += value

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._values)

    def reset(self) -> None:
        """Zero every counter."""
        with self._lock:
            self._values = dict.fromkeys(COUNTERS, 0)


class Scheduler:
    """Serves the requests of a queue on the calling thread until it reads ``None``.

    Args:
        requests: Where ``(request, future)`` pairs arrive; ``None`` stops the loop once the
            running batch is done.
        runner: Model forward passes.
        decoder: Sampling, text and logprob entries per row.
        cache: The prefix cache, or ``None`` to prefill every prompt whole.
        counters: Where prefill, decode and batch counts go.
        max_batch_size: Most rows decoded together.
        batch_window: Seconds the idle loop waits after a first request for companions.
        max_context_tokens: The model's context window (clips ``max_new_tokens``).
    """

    def __init__(
        self,
        requests: queue.Queue[Item],
        runner: ModelRunner,
        decoder: Decoder,
        cache: PrefixCache | None,
        counters: Counters,
        *,
        max_batch_size: int,
        batch_window: float,
        max_context_tokens: int,
    ) -> None:
        self.requests = requests
        self.runner = runner
        self.decoder = decoder
        self.cache = cache
        self.counters = counters
        self.max_batch_size = max_batch_size
        self.batch_window = batch_window
        self.max_context_tokens = max_context_tokens
        self.active: list[RequestState] = []
        self.batch: BatchKV | None = None
        self.stopping = False
        self.admitting: list[RequestState] = []  # started this step, not yet in the batch
        self._trimmed = time.monotonic()

    def run(self) -> None:
        """The worker loop: admit what arrived, decode one step, retire finished rows; repeat.

        Once stopped, it refuses what is left on the queue and empties the prefix cache.
        """
        while not (self.stopping and not self.active):
            incoming = self._collect()
            try:
                with torch.inference_mode():
                    self._step(incoming)
            except Exception as exc:  # noqa: BLE001 - a failed step must not kill the worker
                # Requests being admitted are running futures too: left out, their callers wait forever.
                for seq in self.active + self.admitting:
                    if not seq.future.done():
                        seq.future.set_exception(exc)
                self.active, self.batch = [], None
            self.admitting = []
        self._refuse_leftovers()
        # The process-wide registry (shared_engine) keeps a closed engine until one with its settings
        # is made again: its cache (up to cache_max_bytes) stayed held by an engine nothing could use.
        if self.cache is not None:
            self.cache.clear()

    def _collect(self) -> list[tuple[GenerationRequest, RequestFuture]]:
        """New requests for the free rows: block (then wait ``batch_window``) only when idle."""
        incoming: list[tuple[GenerationRequest, RequestFuture]] = []
        room = self.max_batch_size - len(self.active)
        if self.active:
            while len(incoming) < room and not self.stopping:
                try:
                    item = self.requests.get_nowait()
                except queue.Empty:
                    break
                self._take(item, incoming)
            return incoming
        item = self.requests.get()
        if item is None:
            self.stopping = True
            return incoming
        incoming.append(item)
        deadline = time.monotonic() + self.batch_window
        while len(incoming) < room and not self.stopping:
            try:
                item = self.requests.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            self._take(item, incoming)
        return incoming

    def _take(self, item: Item, incoming: list[tuple[GenerationRequest, RequestFuture]]) -> None:
        if item is None:
            self.stopping = True
        else:
            incoming.append(item)

    def _refuse_leftovers(self) -> None:
        # A request submitted while close() was putting its sentinel must not wait forever.
        while True:
            try:
                item = self.requests.get_nowait()
            except queue.Empty:
                return
            if item is not None and item[1].set_running_or_notify_cancel():
                item[1].set_exception(RuntimeError("engine is closed"))

    def _step(self, incoming: list[tuple[GenerationRequest, RequestFuture]]) -> None:
        started = time.perf_counter_ns()
        pending = [seq for req, fut in incoming if (seq := self._start(req, fut)) is not None]
        self.admitting = list(pending)
        live, finished = [], []
        try:
            while pending:
                ready, pending = self._round(pending)
                for seq in self._prefill(ready):
                    (live if seq.finish is None else finished).append(seq)
            if live:
                # After every round: the cache now holds all their prompts, so they join by one view
                # of what they share.
                self._join(live)
        finally:
            admitted = time.perf_counter_ns()
            # Counted before any result is visible: a caller reading stats() after its result sees
            # its work. Resolved even if a later round or the join failed: their results are done.
            self.counters.add(_prefill_ns=admitted - started)
            for seq in finished:
                self._resolve(seq)
        self.admitting = []
        if self.active:
            self._retire()  # rows whose caller has gone leave before a step is spent on them
        if self.active:
            self._decode()
            self.counters.add(_decode_ns=time.perf_counter_ns() - admitted)
            self._retire()

    def _start(self, req: GenerationRequest, fut: RequestFuture) -> RequestState | None:
        if not fut.set_running_or_notify_cancel():
            return None
        try:
            prompt = list(req.prompt_ids)
            generator = None
            if req.temperature > 0:
                generator = seeded_generator(req.seed if req.seed is not None else random.getrandbits(64))
            return RequestState(
                req=req,
                future=fut,
                prompt=prompt,
                generator=generator,
                max_new=len(req.forced_ids) or max(0, min(req.max_new_tokens, self.max_context_tokens - len(prompt))),
                context=prompt[-4:],
            )
        except Exception as exc:  # noqa: BLE001 - only this request is wrong: the batch goes on
            # Raised out of _step, it would fail the running rows and strand the others admitted with it.
            fut.set_exception(exc)
            return None

    def _round(self, pending: list[RequestState]) -> tuple[list[RequestState], list[RequestState]]:
        """Which pending requests to prefill now; the rest wait for a sibling's prompt to be cached.

        A request whose prompt shares more with one prefilled now than the cache holds is deferred
        to the next round, where it finds that prompt in the cache (so eight branches of one new
        prompt compute it once, then their own suffixes together).
        """
        ready, later = [], []
        for seq in pending:
            hit = self.cache.match(seq.prompt, len(seq.prompt) - 1) if self.cache is not None else PrefixMatch(0, ())
            n = hit.length + _SHARED_ENOUGH
            if self.cache is not None and any(
                seq.prompt[:n] == other.prompt[:n] for other in ready if len(other.prompt) >= n
            ):
                later.append(seq)
                continue
            seq.cached, seq.pieces = hit.length, list(hit.pieces)
            ready.append(seq)
        return ready, later

    def _prefill(self, ready: list[RequestState]) -> list[RequestState]:
        """Prefill the requests together after their cached prefixes and choose their first tokens.

        A scored request (``forced_ids``) is prefilled with its continuation, whose every token's
        logits come from this one pass: it is finished here and never takes decode steps.
        """
        # All forced tokens but the last are fed: the logits after the prompt and after each of
        # them are the distributions the forced tokens are scored under.
        tokens = [seq.prompt + list(seq.req.forced_ids[:-1]) for seq in ready]
        try:
            done = self.runner.prefill(
                [(t, seq.pieces) for t, seq in zip(tokens, ready, strict=True)],
                tails=[len(seq.req.forced_ids) or 1 for seq in ready],
            )
        except Exception as exc:  # noqa: BLE001 - reported to the callers through their futures
            for seq in ready:
                seq.future.set_exception(exc)
            return []
        kept = []
        for seq, fed, (state, rows) in zip(ready, tokens, done, strict=True):
            try:
                self._take_prefill(seq, fed, state, rows)
            except Exception as exc:  # noqa: BLE001 - only this request is wrong: the others go on
                # Raised out of _prefill, it would fail the running rows and those admitted with it.
                seq.future.set_exception(exc)
            else:
                kept.append((seq, rows))
        finished = [seq for seq, _ in kept if seq.finish is not None]
        sampled = [(seq, rows) for seq, rows in kept if seq.finish is None]
        if sampled:
            try:
                self._consume([seq for seq, _ in sampled], torch.cat([rows for _, rows in sampled]))
            except Exception as exc:  # noqa: BLE001 - fails the requests admitted now, not the running rows
                for seq, _ in sampled:
                    seq.future.set_exception(exc)
                return finished
        return [seq for seq, _ in kept]

    def _take_prefill(
        self, seq: RequestState, fed: list[int], state: tuple[torch.Tensor, ...], rows: torch.Tensor
    ) -> None:
        """Count and cache one request's prefill; a scored request is scored (and finished) here."""
        self.counters.add(
            requests=1,
            prefill_tokens_computed=len(seq.prompt) - seq.cached,
            prefill_tokens_reused=seq.cached,
            _hits=int(seq.cached > 0),
        )
        if self.cache is not None:
            self.cache.insert(fed, state, start=seq.cached, adopt=True)
        seq.pieces.append((state, len(fed) - seq.cached))
        if seq.max_new == 0:
            seq.finish = "length"
        if seq.req.forced_ids:
            for i in range(len(rows)):  # the decoder scores a row's tokens in order
                self.decoder.step([seq], rows[i : i + 1])
            self.counters.add(scored_tokens=len(rows))

    def _join(self, admitted: list[RequestState]) -> None:
        """Add freshly prefilled requests to the running batch."""
        self.active = self.active + admitted  # a failed join fails them all
        for seq in admitted:
            # The prompts are in the cache now: siblings find their common prefix there, as one entry.
            again = self.cache.match(seq.prompt) if self.cache is not None else None
            if again is not None and again.length == len(seq.prompt):
                seq.pieces = list(again.pieces)
        if self.batch is None:
            runner = self.runner
            self.batch = BatchKV(
                num_layers=runner.num_layers, kv_heads=runner.kv_heads, head_dim=runner.head_dim, dtype=runner.dtype
            )
        self.batch.add([seq.pieces for seq in admitted])
        for seq in admitted:
            seq.pieces = []

    def _decode(self) -> None:
        logits = self.runner.decode(self.batch, [s.gen[-1] for s in self.active])
        self.counters.add(batches=1, batch_rows=len(self.active))
        self._consume(self.active, logits)

    def _consume(self, seqs: list[RequestState], logits: torch.Tensor) -> None:
        before = sum(len(s.gen) for s in seqs)
        self.decoder.step(seqs, logits)
        self.counters.add(decode_tokens=sum(len(s.gen) for s in seqs) - before)

    def _retire(self) -> None:
        """Resolve finished rows, store their KV and drop them from the batch, with the rows whose
        caller cancelled them (:class:`~.requests.RequestFuture`)."""
        done = [i for i, s in enumerate(self.active) if s.finish is not None or s.future.abandoned]
        if not done:
            return
        for i in done:
            seq = self.active[i]
            if seq.finish is None:  # nobody waits for it: neither its result nor its KV is kept
                self.counters.add(cancelled=1)  # counted before the result is visible, as every counter
                seq.future.set_exception(CancelledError("the request was cancelled by its caller"))
                continue
            # The KV covers prompt + gen when the row ended on EOS (the last kept token was fed to
            # produce it), prompt + gen[:-1] otherwise (the last sampled token was never fed).
            if self.cache is not None:
                tokens = seq.prompt + seq.gen
                start, state = self.batch.row_state(i)
                covered = start + state[0].shape[-2]
                if covered == len(tokens) - 1:
                    tokens = tokens[:-1]
                if covered == len(tokens):
                    self.cache.insert(tokens, state, start=start)
            self._resolve(seq)
        order = self.batch.remove(done)
        self.active = [self.active[i] for i in order]
        if not self.active:
            self.batch = None
        if time.monotonic() - self._trimmed > _TRIM_EVERY:
            release_freed_memory()
            self._trimmed = time.monotonic()

    @staticmethod
    def _resolve(seq: RequestState) -> None:
        if not seq.future.done():
            seq.future.set_result(seq.result())
