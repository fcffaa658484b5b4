"""In-process inference engine: one worker thread, prefix KV reuse and continuous batching.

Requests are submitted from any thread or event loop and answered through a
:class:`concurrent.futures.Future`. The worker owns the model; its parts are separate modules:
:mod:`.scheduler` (admission, batch membership, retirement), :mod:`.runner` (model forward passes),
:mod:`.kv_batch` and :mod:`.attention` (the batch's KV; attention that reads shared prefix segments
once for all rows), :mod:`.decoding` (sampling, stop strings, logprob entries, detokenising) and
:mod:`.prefix_cache` (the radix tree of cached prefixes).

Log-probabilities are *raw*: ``log_softmax`` of the unwarped logits, before temperature and top-p.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import queue
import threading
import weakref
from concurrent.futures import Future
from typing import Any

from langgraph_parallelmuse.errors import ContextOverflowError, InputError
from langgraph_parallelmuse.logprobs import top_logprobs_problem
from langgraph_parallelmuse.models.decoding import Decoder, eos_ids
from langgraph_parallelmuse.models.hardware import Precision, resolve_precision
from langgraph_parallelmuse.models.prefix_cache import PrefixCache
from langgraph_parallelmuse.models.requests import (
    GenerationRequest,
    GenerationResult,
    RequestFuture,
    integer,
    nonnegative,
    sampling_problem,
)
from langgraph_parallelmuse.models.runner import ModelRunner
from langgraph_parallelmuse.models.scheduler import Counters, Item, Scheduler

__all__ = [
    "GenerationRequest",
    "GenerationResult",
    "InferenceEngine",
    "shared_engine",
]

_live_engines: weakref.WeakSet[InferenceEngine] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # A worker still blocked in the queue at interpreter teardown makes torch's thread pool abort
    # ("terminate called without an active exception"); stop the workers first. Nobody reads a
    # result after exit, so the requests still queued or decoding are dropped, not served.
    for engine in list(_live_engines):
        engine.close(cancel_pending=True)


def _token_ids(ids: Any, name: str) -> list[int]:
    """``ids`` as a list of plain ints (numpy or torch integers are converted), else InputError.

    Converted once here: a float or array id reaching the worker fails every request of its batch.

    Example:
        >>> _token_ids((3, 5), "prompt_ids")
        [3, 5]
        >>> _token_ids([7, 5.0], "forced_ids")
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.InputError: forced_ids holds 5.0: pass a list of integer token ids
    """
    try:
        items = None if isinstance(ids, str) else list(ids)
    except TypeError:  # not iterable: None, a number, a 0-d array
        items = None
    if items is None:
        raise InputError(f"{name}={ids!r}: pass a list of integer token ids")
    converted = []
    for token in items:
        if (value := integer(token)) is None:
            # The offending id, not the whole prompt, goes into the message.
            raise InputError(f"{name} holds {token!r}: pass a list of integer token ids")
        converted.append(value)
    return converted


class _ServedFuture(RequestFuture):
    """A request's future that refuses to be waited for on the worker thread that must resolve it.

    Its done-callbacks, and a request's ``on_text``, run on that thread: a wait there never ended,
    and every request the engine served waited with it.
    """

    def __init__(self, worker: threading.Thread) -> None:
        super().__init__()
        self._worker = worker

    def result(self, timeout: float | None = None) -> GenerationResult:
        self._refuse_a_wait_on_the_worker(timeout)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._refuse_a_wait_on_the_worker(timeout)
        return super().exception(timeout)

    def _refuse_a_wait_on_the_worker(self, timeout: float | None) -> None:
        # A poll (timeout 0) waits for nothing: it gets its TimeoutError, as anywhere.
        waits = timeout is None or timeout > 0
        if waits and not self.done() and threading.current_thread() is self._worker:
            raise RuntimeError(
                "an engine result was waited for on the engine's worker thread (in a future's "
                "done-callback or a request's on_text), which alone can produce it: submit() there "
                "without waiting, and read the result in a callback of that future"
            )


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
        precision: ``"float32"`` (exact), ``"bfloat16"`` matrix products (faster on CPUs with
            AMX / AVX-512-BF16, many times slower on others; moves logprobs by about 0.02 nats on
            average) or ``"auto"`` (bfloat16 where the CPU has it natively, else float32).
        name: Display name of the model.

    Raises:
        ValueError: ``max_batch_size`` is not an integer >= 1, ``batch_window`` not a number of
            seconds >= 0, or ``cache_max_bytes`` not a number of bytes >= 0.

    Example:
        >>> from langgraph_parallelmuse.models.loading import load_model
        >>> loaded = load_model()  # doctest: +SKIP
        >>> engine = InferenceEngine(loaded.model, loaded.tokenizer)  # doctest: +SKIP
        >>> ids = loaded.tokenizer("The capital of France is").input_ids  # doctest: +SKIP
        >>> engine.generate(GenerationRequest(ids, max_new_tokens=4, temperature=0)).text
        ... # doctest: +SKIP
        ' Paris.\\n\\n'
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
        precision: Precision = "float32",
        name: str = "local",
    ) -> None:
        if (rows := integer(max_batch_size)) is None or rows < 1:
            raise ValueError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
        # Read by the worker only: a wrong value killed it there, and the first request hung forever.
        if not nonnegative(batch_window):
            raise ValueError(f"batch_window must be a number of seconds >= 0, got {batch_window!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.batching = batching
        self.max_batch_size = rows if batching else 1
        self.batch_window = batch_window if batching else 0.0
        self.cache = PrefixCache(cache_max_bytes) if prefix_cache else None
        self.max_context_tokens = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self._queue: queue.Queue[Item] = queue.Queue()
        self._counters = Counters()
        self._closed = False
        # Reentrant: close() cancels futures while holding it, and their done-callbacks run there; one
        # that submits again (or closes) deadlocked close() instead of being told the engine is closed.
        self._submit_lock = threading.RLock()
        # Held weakly: a finished future leaves with its caller's last reference. For close(cancel_pending=True).
        self._futures: weakref.WeakSet[RequestFuture] = weakref.WeakSet()
        #: The :class:`~.runner.ModelRunner` (its ``weight_bytes``, ``bytes_per_token``, ``score``).
        self.runner = ModelRunner(model, precision=precision)
        scheduler = Scheduler(
            self._queue,
            self.runner,
            Decoder(tokenizer, eos_ids(model, tokenizer)),
            self.cache,
            self._counters,
            max_batch_size=self.max_batch_size,
            batch_window=self.batch_window,
            max_context_tokens=self.max_context_tokens,
        )
        self._thread = threading.Thread(target=scheduler.run, name=f"engine-{name}", daemon=True)
        self._thread.start()
        _live_engines.add(self)
        # An engine dropped without close() left its worker blocked on the queue for good, holding
        # the prefix cache (up to cache_max_bytes) and a thread: once the requests queued are served,
        # it stops. At exit, _close_all stops the engines still alive (dropping what they serve).
        weakref.finalize(self, self._queue.put, None).atexit = False

    def submit(self, request: GenerationRequest) -> Future[GenerationResult]:
        """Queue a request; the returned future resolves to a :class:`GenerationResult`.

        Cancelling the future (directly, or by cancelling the asyncio task awaiting it through
        ``asyncio.wrap_future``) also stops a request already being decoded (:class:`RequestFuture`).
        Token ids may be any integers (numpy, torch); a copy with plain ``int`` lists is queued.

        The future's done-callbacks run on the engine's worker thread, as a request's ``on_text``
        does: they hold up every request being decoded while they run, and they may submit but not
        wait for an engine result (the future's ``result()`` or ``exception()``, or :meth:`generate`,
        raise ``RuntimeError`` there instead of blocking the worker for good; a
        ``concurrent.futures.wait`` there still would). ``asyncio.wrap_future`` hands the result to an
        event loop instead.

        Raises:
            InputError: The prompt is empty, a token id is not an integer or is outside the
                vocabulary, the seed is not an unsigned 64-bit integer, or a sampling setting is out
                of range (``temperature`` ≥ 0, ``0 ≤ top_p ≤ 1``, ``max_new_tokens`` ≥ 0).
            ContextOverflowError: The prompt fills the model's context window.
        """
        request = self._checked(request)
        future: Future[GenerationResult] = _ServedFuture(self._thread)
        with self._submit_lock:  # a request put after close()'s sentinel would never be served
            if self._closed:
                raise RuntimeError("engine is closed")
            if not self._thread.is_alive():  # queued, the request would wait forever
                raise RuntimeError("the engine's worker is not running in this process (forked after it started)")
            self._futures.add(future)
            self._queue.put((request, future))
        return future

    def _checked(self, request: GenerationRequest) -> GenerationRequest:
        """``request`` with plain-int token ids, after the checks of :meth:`submit`.

        Found in the worker, a bad request would fail every request of the batch, not itself.
        """
        prompt = _token_ids(request.prompt_ids, "prompt_ids")
        forced = _token_ids(request.forced_ids, "forced_ids")
        if not prompt:
            raise InputError("the prompt is empty: send at least one message")
        # A scored pass feeds prompt + forced[:-1], so prompt + forced may fill the context exactly;
        # a generation needs room after the prompt for at least one token.
        if len(prompt) + max(len(forced), 1) > self.max_context_tokens:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens (+ {len(forced)} to score) but the "
                f"model's context is {self.max_context_tokens}: shorten the messages"
            )
        if bad := [t for t in (*prompt, *forced) if not 0 <= t < self.vocab_size]:
            raise InputError(f"token id {bad[0]} is not in the model's vocabulary of {self.vocab_size}")
        if (problem := top_logprobs_problem(request.top_logprobs)) is not None:
            raise InputError(problem)
        if (problem := sampling_problem(request)) is not None:
            raise InputError(problem)
        seed = None if request.seed is None else integer(request.seed)
        # Copies: a caller that changes its stop list after submit must not change a running batch.
        return dataclasses.replace(
            request,
            prompt_ids=prompt,
            forced_ids=forced,
            seed=seed,
            max_new_tokens=integer(request.max_new_tokens),
            temperature=float(request.temperature),
            top_p=float(request.top_p),
            stop=tuple(request.stop),
        )

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Submit and wait; a wait given up (Ctrl-C) cancels the request, so the worker stops it.

        Raises:
            RuntimeError: Called on the engine's worker thread (from a done-callback or an
                ``on_text``), where the wait would never end; see :meth:`submit`.
        """
        future = self.submit(request)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # a request that failed or finished is unaffected
            raise

    def stats(self) -> dict[str, float | int]:
        """Counters since the last :meth:`reset_stats`.

        Keys: ``requests``, ``prefill_tokens_computed``, ``prefill_tokens_reused``,
        ``decode_tokens`` (sampled), ``scored_tokens`` (teacher-forced ``forced_ids``, scored in
        their prefill pass), ``batches`` (joint decode steps), ``batch_rows`` (sequences summed
        over those steps), ``cancelled`` (requests dropped while served because their caller
        cancelled them), ``mean_batch_size``,
        ``cache_hit_rate`` (share of requests that reused a prefix), ``cache_token_reuse``
        (share of prompt tokens reused), ``cache_bytes``, ``prefill_seconds`` (the worker admitting
        requests: prefill, cache insert, joining the batch) and ``decode_seconds`` (the worker
        decoding the running batch).
        """
        s: dict[str, float | int] = dict(self._counters.snapshot())
        prompt = s["prefill_tokens_computed"] + s["prefill_tokens_reused"]
        s["mean_batch_size"] = s["batch_rows"] / s["batches"] if s["batches"] else 0.0
        s["cache_hit_rate"] = s.pop("_hits") / s["requests"] if s["requests"] else 0.0
        s["cache_token_reuse"] = s["prefill_tokens_reused"] / prompt if prompt else 0.0
        s["prefill_seconds"] = s.pop("_prefill_ns") / 1e9
        s["decode_seconds"] = s.pop("_decode_ns") / 1e9
        s["cache_bytes"] = self.cache.nbytes if self.cache is not None else 0
        return s

    def reset_stats(self) -> None:
        """Zero the counters (the prefix cache itself is kept)."""
        self._counters.reset()

    def clear_cache(self) -> None:
        """Drop every prefix-cache entry."""
        if self.cache is not None:
            self.cache.clear()

    @property
    def serving(self) -> bool:
        """Whether the engine takes requests: not closed, and its worker runs in this process (a
        process forked after the engine started has no copy of the worker's thread)."""
        return not self._closed and self._thread.is_alive()

    def close(self, *, cancel_pending: bool = False) -> None:
        """Stop the worker after the queued requests are served, or dropped with ``cancel_pending``.

        The worker drops the prefix cache as it stops. Called on the worker (a done-callback or an
        ``on_text``), close returns at once instead of waiting for the worker to stop.

        Args:
            cancel_pending: Cancel the requests still queued or being decoded instead of serving
                them (their futures raise ``CancelledError``); the interpreter's exit hook does,
                so a script that ends does not wait for results nobody reads.
        """
        with self._submit_lock:
            first = not self._closed
            self._closed = True
            # Also once closed: after a close() on the worker (which returns at once), the exit hook's
            # close(cancel_pending=True) returned here, and the worker went on decoding through
            # interpreter teardown ("terminate called without an active exception").
            if cancel_pending:
                for future in list(self._futures):
                    future.cancel()  # a running one is abandoned: the worker drops it at its next step
            if first:
                self._queue.put(None)
        # Called on the worker (a done-callback or an on_text), the join waited for itself and raised
        # "cannot join current thread": the worker stops, and drops its cache, once that call returns.
        if threading.current_thread() is not self._thread:
            self._thread.join()


_engines: dict[tuple, InferenceEngine] = {}
_engines_lock = threading.Lock()


def _forget_engines() -> None:
    # A forked child has no copy of the workers' threads: its engines are started anew on first use.
    global _engines_lock
    _engines.clear()
    _engines_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_engines)


def shared_engine(
    model_path: str | None = None,
    gguf_file: str | None = None,
    *,
    prefix_cache: bool = True,
    batching: bool = True,
    cache_max_bytes: int = 2 * 1024**3,
    max_batch_size: int = 8,
    precision: Precision = "float32",
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

    loaded = load_model(model_path, gguf_file)
    if precision == "auto":  # one engine per precision it computes in, however it was asked for
        precision = resolve_precision(precision)
    key = (loaded.path, loaded.gguf_file, precision, prefix_cache, batching, cache_max_bytes, max_batch_size)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None or not engine.serving:
            engine = InferenceEngine(
                loaded.model,
                loaded.tokenizer,
                prefix_cache=prefix_cache,
                batching=batching,
                cache_max_bytes=cache_max_bytes,
                max_batch_size=max_batch_size,
                precision=precision,
                name=loaded.name,
            )
            _engines[key] = engine
        return engine
