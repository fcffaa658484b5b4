"""The in-process engine end to end on a tiny random-weight Llama (real transformers calls, fast).

Batched greedy equals unbatched, logprobs equal a teacher-forced forward pass, a shared prompt is
served from the prefix cache, stop strings cut text and logprob entries consistently.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import threading
import time
import warnings
import weakref
from concurrent.futures import CancelledError
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from langgraph_parallelmuse.errors import ConfigError, InputError
from langgraph_parallelmuse.models import GenerationRequest, GenerationResult, InferenceEngine
from langgraph_parallelmuse.models.decoding import Decoder, byte_decoder
from langgraph_parallelmuse.models.hardware import native_bfloat16, resolve_precision
from langgraph_parallelmuse.models.requests import RequestFuture, RequestState
from langgraph_parallelmuse.models.runner import ModelRunner
from langgraph_parallelmuse.models.scheduler import seeded_generator
from tests.unit.processes import ctrl_c_after, in_forked_child
from tests.unit.tiny_model import CHATML, tiny_llama, tiny_sentencepiece_tokenizer, tiny_tokenizer

# float32 batched (shared segments, private rows) vs unbatched attention reorders sums: ~1e-6 here.
LOGPROB_TOL = 1e-4

PROMPTS = [
    "the cat is on the mat and",
    "a short one",
    "there are seven bees in the garden, one for each of the",
    "once upon a time",
]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_llama(tokenizer)


@pytest.fixture(scope="module")
def engine(model, tokenizer):
    engine = InferenceEngine(model, tokenizer, max_batch_size=8)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def plain(model, tokenizer):
    """No prefix cache, no batching: the reference path."""
    engine = InferenceEngine(model, tokenizer, prefix_cache=False, batching=False)
    yield engine
    engine.close()


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text).input_ids


def greedy(tokenizer, text: str, **kwargs) -> GenerationRequest:
    return GenerationRequest(ids(tokenizer, text), **{"max_new_tokens": 12, "temperature": 0.0, **kwargs})


def slow_steps(engine: InferenceEngine, monkeypatch) -> None:
    """Decode steps of 10 ms or more: long enough that a row is surely still running when the test acts."""
    decode = engine.runner.decode

    def slow_decode(*args, **kwargs):
        time.sleep(0.01)
        return decode(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "decode", slow_decode)


def teacher_forced(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """Raw log-probabilities of each generated position from one uncached forward pass."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + generated])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(generated)], dim=-1)


def assert_matches_teacher(model, prompt: list[int], result: GenerationResult) -> None:
    logp = teacher_forced(model, prompt, result.token_ids)
    assert len(result.logprobs) == len(result.token_ids)
    for i, (entry, token) in enumerate(zip(result.logprobs, result.token_ids, strict=True)):
        assert abs(entry["logprob"] - float(logp[i, token])) < LOGPROB_TOL
        values, alternatives = torch.topk(logp[i], len(entry["top_logprobs"]))
        for top, value in zip(entry["top_logprobs"], values.tolist(), strict=True):
            assert abs(top["logprob"] - value) < LOGPROB_TOL
        assert [e["token"] for e in entry["top_logprobs"]] == [
            bytes(e["bytes"]).decode("utf-8", "replace") for e in entry["top_logprobs"]
        ]
        assert len(alternatives) == len(entry["top_logprobs"])


def test_batched_greedy_equals_unbatched_and_logprobs_equal_teacher_forcing(engine, plain, model, tokenizer) -> None:
    requests = [
        greedy(tokenizer, p, max_new_tokens=8 + 3 * i, top_logprobs=5, ignore_eos=True) for i, p in enumerate(PROMPTS)
    ]
    engine.reset_stats()
    batched = [f.result() for f in [engine.submit(r) for r in requests]]
    assert engine.stats()["mean_batch_size"] > 1.5, engine.stats()
    for request, result in zip(requests, batched, strict=True):
        reference = plain.generate(request)
        assert result.token_ids == reference.token_ids
        assert result.text == reference.text
        assert result.finish_reason == "length"
        assert result.completion_tokens == request.max_new_tokens
        assert "".join(e["token"] for e in result.logprobs) == result.text
        assert_matches_teacher(model, list(request.prompt_ids), result)


def test_forced_continuations_score_exactly_those_tokens_with_the_models_logprobs(engine, model, tokenizer) -> None:
    """Candidate answers scored in one batch after one shared prompt: each row's logprobs are the
    model's own for exactly its tokens (an EOS among them too), whatever the sampling settings say."""
    prompt = ids(tokenizer, " ".join(PROMPTS * 3))
    options = [ids(tokenizer, text) + [tokenizer.eos_token_id] for text in (" the bees", " a garden of", " once")]
    requests = [GenerationRequest(prompt, temperature=0.9, top_logprobs=4, forced_ids=o, stop=("e",)) for o in options]
    engine.reset_stats()
    results = [f.result() for f in [engine.submit(r) for r in requests]]
    stats = engine.stats()
    assert stats["prefill_tokens_computed"] < 2 * len(prompt)  # the shared prompt is computed once
    # Scored in the prefill pass: before, each forced token took a decode step of its own.
    assert stats["batches"] == 0 and stats["decode_tokens"] == 0
    assert stats["scored_tokens"] == sum(map(len, options))
    for option, result in zip(options, results, strict=True):
        assert result.token_ids == option and result.finish_reason == "length"
        assert_matches_teacher(model, prompt, result)


def test_a_scored_continuation_split_over_passes_keeps_every_tokens_logprobs(model, tokenizer, monkeypatch) -> None:
    # Prompt and continuation fed in passes of 16: the continuation's logits straddle the second
    # and third pass, while a generating request shares the passes.
    from langgraph_parallelmuse.models import runner as runner_module

    monkeypatch.setattr(runner_module, "_PREFILL_CHUNK", 16)
    prompt = ids(tokenizer, " ".join(PROMPTS))[:30]
    option = prompt[3:7] + [tokenizer.eos_token_id]  # fed: 30 + 4 tokens, logits after positions 29..33
    engine = InferenceEngine(model, tokenizer)
    try:
        scored = engine.submit(GenerationRequest(prompt, temperature=0.0, top_logprobs=3, forced_ids=option))
        sampled = engine.submit(greedy(tokenizer, PROMPTS[2], max_new_tokens=4, top_logprobs=3, ignore_eos=True))
        results = [scored.result(), sampled.result()]
    finally:
        engine.close()
    assert results[0].token_ids == option and results[0].prompt_tokens == len(prompt)
    assert_matches_teacher(model, prompt, results[0])
    assert_matches_teacher(model, ids(tokenizer, PROMPTS[2]), results[1])


def test_sampled_rows_keep_their_own_seed_and_settings_in_a_batch(engine, plain, model, tokenizer) -> None:
    prompt = ids(tokenizer, PROMPTS[0])
    requests = [
        GenerationRequest(prompt, max_new_tokens=10, temperature=t, top_p=p, seed=s, top_logprobs=3, ignore_eos=True)
        for t, p, s in [(0.8, 0.9, 1), (0.8, 0.9, 2), (1.2, 1.0, 1), (0.0, 1.0, None)]
    ]
    batched = [f.result() for f in [engine.submit(r) for r in requests]]
    for request, result in zip(requests, batched, strict=True):
        assert result.token_ids == plain.generate(request).token_ids
        assert_matches_teacher(model, prompt, result)
    assert batched[0].token_ids != batched[1].token_ids  # different seeds, different samples


def test_seeds_that_differ_only_above_32_bits_draw_different_samples(engine, tokenizer) -> None:
    # torch's manual_seed kept a CPU generator's low 32 bits: seeds 5, 5 + 2**32 and 5 + 2**63 drew
    # one sample.
    def sample(seed: int) -> list[int]:
        request = greedy(tokenizer, PROMPTS[3], max_new_tokens=16, temperature=1.5, seed=seed, ignore_eos=True)
        return engine.generate(request).token_ids

    samples = [sample(seed) for seed in (5, 5 + 2**32, 5 + 2**63, 2**64 - 1)]
    assert len({tuple(s) for s in samples}) == len(samples)
    assert sample(5 + 2**32) == samples[1]  # a seed still gives one stream


def test_a_large_seed_sets_the_twister_python_seeds_from_it_and_a_small_one_keeps_torchs() -> None:
    # The generator's state is written in torch's serialised layout: a layout torch changed would
    # give other words than the Mersenne Twister Python's random seeds from the same bits.
    seed = 5 + 2**40
    python = random.Random(seed)
    drawn = torch.empty(8, dtype=torch.int32).random_(generator=seeded_generator(seed)).tolist()
    assert drawn == [python.getrandbits(32) % 2**31 for _ in range(8)]
    reference = torch.Generator()
    reference.manual_seed(5)
    assert torch.rand(8, generator=seeded_generator(5)).tolist() == torch.rand(8, generator=reference).tolist()


def test_a_request_joining_a_running_batch_decodes_as_alone(model, tokenizer, plain) -> None:
    engine = InferenceEngine(model, tokenizer, batch_window=0.0)
    try:
        first = engine.submit(greedy(tokenizer, PROMPTS[2], max_new_tokens=60, ignore_eos=True))
        time.sleep(0.02)  # the first request is decoding when the others arrive
        later = [engine.submit(greedy(tokenizer, p, max_new_tokens=20, ignore_eos=True)) for p in PROMPTS[:2]]
        results = [first.result(), *(f.result() for f in later)]
    finally:
        engine.close()
    for text, n, result in zip([PROMPTS[2], *PROMPTS[:2]], [60, 20, 20], results, strict=True):
        assert result.token_ids == plain.generate(greedy(tokenizer, text, max_new_tokens=n, ignore_eos=True)).token_ids


def test_a_shared_prompt_is_served_from_the_prefix_cache(engine, plain, model, tokenizer) -> None:
    engine.clear_cache()
    shared = ids(tokenizer, PROMPTS[2])
    first = engine.generate(GenerationRequest(shared, max_new_tokens=6, temperature=0.0, ignore_eos=True))
    assert first.cached_tokens == 0
    # A branch continues the first request's prompt with other text: its prompt is served from cache.
    branch = shared + ids(tokenizer, " what")
    second = engine.generate(GenerationRequest(branch, max_new_tokens=6, temperature=0.0, top_logprobs=4))
    assert second.cached_tokens >= len(shared)
    assert second.prompt_tokens == len(branch)
    reference = plain.generate(GenerationRequest(branch, max_new_tokens=6, temperature=0.0, top_logprobs=4))
    assert second.token_ids == reference.token_ids and reference.cached_tokens == 0
    assert_matches_teacher(model, branch, second)
    stats = engine.stats()
    assert stats["prefill_tokens_reused"] >= len(shared) and stats["cache_bytes"] > 0


def test_stats_split_the_worker_time_between_admitting_and_decoding(model, tokenizer) -> None:
    # The split says where a rollout's time goes (prompt work vs batched decoding), so each side
    # must count only its own work and neither may exceed the time the requests took.
    engine = InferenceEngine(model, tokenizer)
    try:
        prompt = ids(tokenizer, " ".join(PROMPTS * 3))
        t0 = time.perf_counter()
        engine.generate(GenerationRequest(prompt, max_new_tokens=0))
        only_prompt = engine.stats()
        engine.reset_stats()
        engine.generate(GenerationRequest(prompt + ids(tokenizer, " next"), max_new_tokens=8, ignore_eos=True))
        wall = time.perf_counter() - t0
        both = engine.stats()
    finally:
        engine.close()
    assert only_prompt["prefill_seconds"] > 0 and only_prompt["decode_seconds"] == 0
    assert both["decode_tokens"] == 8 and both["batches"] == 7 and both["decode_seconds"] > 0
    assert only_prompt["prefill_seconds"] + both["prefill_seconds"] + both["decode_seconds"] <= wall


async def test_a_request_cancelled_while_decoding_leaves_the_batch(model, tokenizer, plain, monkeypatch) -> None:
    # A trajectory cancelled by a consensus stop gives up its step's request through
    # asyncio.wrap_future; a running concurrent future cannot be cancelled, so its row went on
    # decoding to max_new_tokens beside the requests still wanted.
    engine = InferenceEngine(model, tokenizer)
    slow_steps(engine, monkeypatch)  # the row is surely cancelled mid-way
    try:
        future = engine.submit(GenerationRequest(ids(tokenizer, PROMPTS[1]), max_new_tokens=240, ignore_eos=True))
        waiting = asyncio.ensure_future(asyncio.wrap_future(future))
        while engine.stats()["decode_tokens"] < 3:
            await asyncio.sleep(0.005)
        waiting.cancel()
        # Waited for off the loop, which meanwhile passes the cancellation on to the engine's future.
        error = await asyncio.to_thread(future.exception, 30)
        assert isinstance(error, CancelledError) and "cancelled by its caller" in str(error)
        dropped = engine.stats()
        kept = await asyncio.wrap_future(engine.submit(greedy(tokenizer, PROMPTS[0])))
        after = engine.stats()
    finally:
        engine.close()
    assert dropped["cancelled"] == 1 and dropped["decode_tokens"] < 100
    assert after["decode_tokens"] - dropped["decode_tokens"] == len(kept.token_ids)  # nothing else decodes
    assert kept.token_ids == plain.generate(greedy(tokenizer, PROMPTS[0])).token_ids


def test_an_engine_dropped_without_close_serves_what_it_was_sent_then_stops(model, tokenizer, plain) -> None:
    # Its worker stayed blocked on the queue for good, keeping a thread and the prefix cache (up to
    # cache_max_bytes) alive: a notebook re-running a cell that builds an engine piled them up.
    engine = InferenceEngine(model, tokenizer)
    request = greedy(tokenizer, PROMPTS[0])
    future = engine.submit(request)
    worker, cache = engine._thread, weakref.ref(engine.cache)
    del engine
    gc.collect()
    assert future.result(timeout=60).token_ids == plain.generate(request).token_ids
    worker.join(timeout=20)
    gc.collect()
    assert not worker.is_alive() and cache() is None


def test_a_closed_engine_releases_its_prefix_cache(model, tokenizer) -> None:
    # shared_engine's registry keeps a closed engine until one with its settings is made again: its
    # prefix cache (up to cache_max_bytes) stayed held, so close() freed the thread but not the memory.
    engine = InferenceEngine(model, tokenizer)
    engine.generate(greedy(tokenizer, PROMPTS[0]))
    assert engine.stats()["cache_bytes"] > 0
    engine.close()
    assert engine.stats()["cache_bytes"] == 0


def test_an_engine_closed_on_its_worker_serves_what_it_holds_then_stops_and_frees_its_cache(
    model, tokenizer, plain
) -> None:
    # close() from a done-callback or an on_text joined the worker from the worker: it raised
    # "cannot join current thread" (failing that request) and left the prefix cache held.
    engine = InferenceEngine(model, tokenizer, batch_window=0.5)
    closing = greedy(tokenizer, PROMPTS[0], on_text=lambda text: engine.close())
    other = greedy(tokenizer, PROMPTS[1])
    futures = [engine.submit(closing), engine.submit(other)]
    assert [f.result(timeout=60).token_ids for f in futures] == [plain.generate(r).token_ids for r in (closing, other)]
    engine._thread.join(timeout=20)
    assert not engine._thread.is_alive() and engine.stats()["cache_bytes"] == 0


def test_a_generate_call_interrupted_by_ctrl_c_cancels_its_request(model, tokenizer, monkeypatch) -> None:
    # The sync path (LocalChatModel.invoke, a sync chain) waits in generate(): after Ctrl-C the row
    # went on to max_new_tokens, and the exit hook that closes the engine waited for it.
    engine = InferenceEngine(model, tokenizer)
    slow_steps(engine, monkeypatch)
    try:
        with ctrl_c_after(0.3), pytest.raises(KeyboardInterrupt):
            engine.generate(GenerationRequest(ids(tokenizer, PROMPTS[1]), max_new_tokens=240, ignore_eos=True))
        deadline = time.monotonic() + 10
        while engine.stats()["cancelled"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = engine.stats()
    finally:
        engine.close()
    assert stats["cancelled"] == 1 and stats["decode_tokens"] < 200


def test_a_closed_or_forked_engine_is_replaced_or_refuses_rather_than_hanging(model, tokenizer, monkeypatch) -> None:
    # shared_engine handed out a closed engine ("engine is closed" for every later model), and in a
    # forked child an engine whose worker thread did not exist there: its requests waited forever.
    from langgraph_parallelmuse.models import engine as engine_module
    from langgraph_parallelmuse.models import loading

    loaded = SimpleNamespace(path="tiny", gguf_file=None, model=model, tokenizer=tokenizer, name="tiny")
    monkeypatch.setattr(loading, "load_model", lambda *args: loaded)
    before = dict(engine_module._engines)
    first = engine_module.shared_engine()
    try:
        assert in_forked_child(lambda: first.submit(greedy(tokenizer, "hi"))) == (
            "RuntimeError: the engine's worker is not running in this process (forked after it started)"
        )
        first.close()
        second = engine_module.shared_engine()
        assert second is not first and second.serving
        assert second.generate(greedy(tokenizer, PROMPTS[0])).token_ids
    finally:
        for key, engine in list(engine_module._engines.items()):
            if before.get(key) is not engine:
                engine.close()
                del engine_module._engines[key]
        first.close()


def test_close_cancelling_a_request_whose_callback_submits_again_does_not_deadlock(
    model, tokenizer, monkeypatch
) -> None:
    # close(cancel_pending=True) cancels the queued futures while holding the submit lock, and their
    # done-callbacks run right there: one that resubmitted waited for that lock, and close() for it.
    engine = InferenceEngine(model, tokenizer, max_batch_size=1)
    slow_steps(engine, monkeypatch)
    request = greedy(tokenizer, PROMPTS[0], max_new_tokens=200, ignore_eos=True)
    running = engine.submit(request)
    queued = engine.submit(request)  # one row only: it waits in the queue
    refused = []

    def resubmit(future) -> None:
        try:
            engine.submit(request)
        except RuntimeError as exc:
            refused.append(str(exc))

    queued.add_done_callback(resubmit)
    closer = threading.Thread(target=engine.close, kwargs={"cancel_pending": True}, daemon=True)
    closer.start()
    closer.join(timeout=30)
    assert not closer.is_alive(), "close() deadlocked"
    assert refused == ["engine is closed"]
    assert queued.cancelled()
    with pytest.raises(CancelledError):
        running.result(timeout=30)


def test_a_done_callback_that_waits_for_the_engine_is_refused_and_the_engine_goes_on(model, tokenizer) -> None:
    # Done-callbacks run on the worker, which alone resolves engine futures: a callback calling
    # generate() (or result() on a future it submitted) waited for itself, and no request was
    # served again.
    engine = InferenceEngine(model, tokenizer)
    request = greedy(tokenizer, PROMPTS[1], max_new_tokens=4)
    errors = []

    def waits(wait):
        def callback(future) -> None:
            try:
                wait()
            except RuntimeError as exc:
                errors.append(str(exc))

        return callback

    for wait in (lambda: engine.generate(request), lambda: engine.submit(request).result()):
        first = engine.submit(request)
        first.add_done_callback(waits(wait))
        first.result(timeout=30)
        assert engine.submit(request).result(timeout=30).token_ids == first.result().token_ids
    assert len(errors) == 2 and all("worker thread" in e for e in errors)
    polled = []  # a poll waits for nothing: "not yet", as anywhere (the first refusal raised here too)

    def polls(future) -> None:
        try:
            engine.submit(request).result(timeout=0)
        except TimeoutError:
            polled.append("not yet")

    first = engine.submit(request)
    first.add_done_callback(polls)
    first.result(timeout=30)
    assert polled == ["not yet"]
    engine.close()


def test_branches_of_a_new_prompt_compute_it_once(model, tokenizer, plain) -> None:
    shared = ids(tokenizer, " ".join(PROMPTS * 3))  # longer than the scheduler's sharing threshold
    branches = [shared + ids(tokenizer, f" branch {i} says") for i in range(4)]
    engine = InferenceEngine(model, tokenizer)
    try:
        requests = [GenerationRequest(b, max_new_tokens=5, temperature=0.0, ignore_eos=True) for b in branches]
        results = [f.result() for f in [engine.submit(r) for r in requests]]
        stats = engine.stats()
    finally:
        engine.close()
    common = len(os.path.commonprefix(branches))
    assert stats["prefill_tokens_computed"] == len(branches[0]) + sum(len(b) - common for b in branches[1:])
    assert [r.cached_tokens for r in results] == [0] + [common] * 3
    for request, result in zip(requests, results, strict=True):
        assert result.token_ids == plain.generate(request).token_ids


def test_branches_forked_at_two_depths_while_the_parent_decodes_read_one_copy_of_its_prompt(
    model, tokenizer, plain, monkeypatch
) -> None:
    # Online branching: a branch forks from a running parent at one step, another at an earlier one.
    # Each fork split the parent's cache edge into copies, so every row read a private copy of the
    # common prompt (three copies here) and the batch held memory the cache bound never counted.
    from langgraph_parallelmuse.models import kv_batch

    monkeypatch.setattr(kv_batch, "_SEGMENT_MIN", 32)  # the tiny model's prompts stay in place as segments
    engine = InferenceEngine(model, tokenizer, batch_window=0.0)
    seen: list[tuple[int, int, int]] = []  # per step: rows, positions in segments, bytes of their storages
    decode = engine.runner.decode

    def watched(batch, tokens):
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for s in batch.segments.values()
            for t in s.state
        }
        seen.append((len(batch), batch.shared_positions, sum(storages.values())))
        time.sleep(0.01)  # the parent surely runs on while the branches arrive
        return decode(batch, tokens)

    monkeypatch.setattr(engine.runner, "decode", watched)

    def wait_for(rows: int) -> None:
        deadline = time.monotonic() + 30
        while not any(n == rows for n, _, _ in seen) and time.monotonic() < deadline:
            time.sleep(0.002)

    parent = ids(tokenizer, " ".join(PROMPTS * 3))[:120]
    requests = [GenerationRequest(parent, max_new_tokens=80, temperature=0.0, ignore_eos=True)]
    requests += [
        GenerationRequest(parent[:depth] + ids(tokenizer, " so"), max_new_tokens=20, temperature=0.0, ignore_eos=True)
        for depth in (100, 70)
    ]
    try:
        futures = [engine.submit(requests[0])]
        for rows, request in enumerate(requests[1:], 1):
            wait_for(rows)
            futures.append(engine.submit(request))
        results = [f.result(timeout=60) for f in futures]
    finally:
        engine.close()
    three = [(positions, nbytes) for rows, positions, nbytes in seen if rows == 3]
    assert three, seen
    # The three rows read the parent's prompt once: its 120 positions in one storage.
    assert set(three) == {(len(parent), len(parent) * engine.runner.bytes_per_token)}
    for request, result in zip(requests, results, strict=True):
        assert result.token_ids == plain.generate(request).token_ids


def test_a_scored_continuation_may_fill_the_context_a_prompt_alone_may_not(model, tokenizer) -> None:
    # The scoring pass feeds prompt + forced[:-1]: 250 + 6 tokens fit a 256-token context, as a
    # generation of 250 + 6 does; a prompt that fills the context leaves no room to generate.
    engine = InferenceEngine(model, tokenizer)
    context = engine.max_context_tokens
    prompt = [(7 * i) % 200 + 3 for i in range(context - 6)]
    forced = [11, 12, 13, 14, 15, 16]
    try:
        scored = engine.generate(GenerationRequest(prompt, forced_ids=forced, top_logprobs=1))
        generated = engine.generate(GenerationRequest(prompt, max_new_tokens=6, temperature=0.0, ignore_eos=True))
        with pytest.raises(InputError, match="context"):
            engine.submit(GenerationRequest(prompt, forced_ids=[*forced, 17]))
        with pytest.raises(InputError, match="context"):
            engine.submit(GenerationRequest([5] * context, max_new_tokens=1))
        alone = engine.generate(
            GenerationRequest([5] * (context - 1), max_new_tokens=4, temperature=0.0, ignore_eos=True)
        )
    finally:
        engine.close()
    assert scored.token_ids == forced
    assert_matches_teacher(model, prompt, scored)
    assert generated.completion_tokens == 6
    assert alone.completion_tokens == 1  # one position left: one token


def test_prompts_longer_than_a_pass_are_split_over_passes(model, tokenizer, monkeypatch) -> None:
    from langgraph_parallelmuse.models import runner as runner_module

    monkeypatch.setattr(runner_module, "_PREFILL_CHUNK", 16)
    engine = InferenceEngine(model, tokenizer)
    try:
        prompts = [ids(tokenizer, p) for p in (PROMPTS[2], PROMPTS[1], PROMPTS[0])]  # 35, 8 and 15 tokens
        requests = [GenerationRequest(p, max_new_tokens=4, temperature=0.0, top_logprobs=2) for p in prompts]
        results = [f.result() for f in [engine.submit(r) for r in requests]]
    finally:
        engine.close()
    for prompt, result in zip(prompts, results, strict=True):
        assert_matches_teacher(model, prompt, result)


def test_stop_strings_cut_text_and_entries(engine, tokenizer) -> None:
    request = greedy(tokenizer, PROMPTS[0], max_new_tokens=24, ignore_eos=True)
    full = engine.generate(request)
    # A stop string starting one character into a multi-character token trims that token.
    starts = [0]
    for entry in full.logprobs:
        starts.append(starts[-1] + len(entry["token"]))
    k = next(i for i, e in enumerate(full.logprobs[1:], 1) if len(e["token"]) > 1 and "\ufffd" not in e["token"])
    at = starts[k] + 1
    stop = full.text[at : at + 2]
    at = full.text.index(stop)
    cut = engine.generate(greedy(tokenizer, PROMPTS[0], max_new_tokens=24, ignore_eos=True, stop=("zzzz", stop)))
    assert cut.text == full.text[:at]
    assert cut.finish_reason == "stop"
    assert "".join(e["token"] for e in cut.logprobs) == cut.text
    last = cut.logprobs[-1]
    whole = full.logprobs[len(cut.logprobs) - 1]
    assert last["logprob"] == whole["logprob"] and whole["token"].startswith(last["token"])


def test_eos_ends_a_request_unless_ignored(plain, tokenizer) -> None:
    first = plain.generate(greedy(tokenizer, PROMPTS[1], max_new_tokens=1)).token_ids[0]
    model = tiny_llama(tokenizer)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, first]  # the first greedy token ends it
    engine = InferenceEngine(model, tokenizer)
    try:
        stopped = engine.generate(greedy(tokenizer, PROMPTS[1]))
        kept = engine.generate(greedy(tokenizer, PROMPTS[1], max_new_tokens=3, ignore_eos=True))
    finally:
        engine.close()
    assert stopped.finish_reason == "stop" and stopped.token_ids == [] and stopped.text == ""
    assert kept.token_ids[0] == first and kept.completion_tokens == 3 and kept.finish_reason == "length"


def test_eos_after_part_of_a_character_keeps_its_text_as_a_length_cut_does(tokenizer) -> None:
    # Before, the text of the character's first byte was dropped: token ids held it, text and logprobs did not.
    decoder = Decoder(tokenizer, frozenset({tokenizer.eos_token_id}))
    first_byte = ids(tokenizer, "é")[0]
    request = greedy(tokenizer, "hi", logprobs=True, top_logprobs=0)
    prompt = request.prompt_ids
    seq = RequestState(req=request, future=RequestFuture(), prompt=prompt, max_new=12, generator=None, context=prompt)
    for token in (*ids(tokenizer, "ab"), first_byte, tokenizer.eos_token_id):
        logits = torch.full((1, len(tokenizer)), -10.0)
        logits[0, token] = 10.0
        decoder.step([seq], logits)
    result = seq.result()
    assert result.finish_reason == "stop" and result.token_ids == [*ids(tokenizer, "ab"), first_byte]
    assert result.text == "ab\ufffd" and "".join(e["token"] for e in result.logprobs) == result.text


def test_a_stop_string_ended_by_the_text_flushed_at_eos_cuts_it(tokenizer) -> None:
    # The text held back for an incomplete character (here " " of a token " \xc3") was added at EOS
    # without a stop check: the result ended in the stop string a length cut or a later token cut.
    split = tiny_tokenizer(extra_merges=("Ġ Ã",))
    decoder = Decoder(split, frozenset({split.eos_token_id}))
    space_and_first_byte = ids(split, " é")[0]
    request = greedy(split, "hi", stop=[": "], logprobs=True)
    seq = RequestState(request, RequestFuture(), request.prompt_ids, 12, None, request.prompt_ids)
    for token in (*ids(split, "a:"), space_and_first_byte, split.eos_token_id):
        logits = torch.full((1, len(split)), -10.0)
        logits[0, token] = 10.0
        decoder.step([seq], logits)
    result = seq.result()
    assert result.finish_reason == "stop" and result.text == "a"
    assert "".join(e["token"] for e in result.logprobs) == "a"


def test_bad_requests_are_refused(engine, tokenizer) -> None:
    with pytest.raises(InputError, match="empty"):
        engine.submit(GenerationRequest([]))
    with pytest.raises(InputError, match="top_logprobs"):
        engine.submit(greedy(tokenizer, "hi", top_logprobs=21))
    with pytest.raises(InputError, match="context"):
        engine.submit(GenerationRequest(list(range(5)) * 60))
    with pytest.raises(InputError, match=r"seed=18446744073709551616: pass an integer in \[0, 2\*\*64\)"):
        engine.submit(greedy(tokenizer, "hi", temperature=0.7, seed=2**64))
    # Out-of-vocabulary ids found in the worker would fail every request of the running batch.
    vocab = engine.vocab_size
    with pytest.raises(InputError, match=f"token id {vocab} is not in the model's vocabulary of {vocab}"):
        engine.submit(GenerationRequest(ids(tokenizer, "hi"), forced_ids=[5, vocab]))
    with pytest.raises(InputError, match="token id -1 is not"):
        engine.submit(GenerationRequest([-1, 5]))


def test_bad_sampling_settings_are_refused_before_they_reach_a_batch(engine, tokenizer) -> None:
    # Before the fix temperature=None raised inside the worker's admission: the requests admitted
    # with it, and the rows already decoding, never resolved.
    # A float or bool seed passed the range check and failed later, in the worker's manual_seed.
    settings = [("temperature", None), ("temperature", -1.0), ("top_p", 1.5), ("max_new_tokens", None)]
    settings += [("seed", 1.5), ("seed", 2.0), ("seed", True), ("max_new_tokens", True)]
    for setting, value in settings:
        with pytest.raises(InputError, match=f"{setting}={value!r}"):
            engine.submit(greedy(tokenizer, "hi", **{setting: value}))


def test_bad_engine_settings_are_refused_by_the_constructor(model, tokenizer) -> None:
    # batch_window is read by the worker only: None or a string raised there, the worker died, and
    # the first request submitted never resolved (later ones were refused as "not running").
    for window in (None, "0.02", float("nan"), -1.0, True):
        with pytest.raises(ValueError, match=f"batch_window must be a number of seconds >= 0, got {window!r}"):
            InferenceEngine(model, tokenizer, batch_window=window)
    for rows in (0, 2.5, "4", None):
        with pytest.raises(ValueError, match="max_batch_size must be an integer >= 1"):
            InferenceEngine(model, tokenizer, max_batch_size=rows)
    engine = InferenceEngine(model, tokenizer, batch_window=0, max_batch_size=np.int64(2))
    try:
        assert engine.max_batch_size == 2 and type(engine.max_batch_size) is int
        assert engine.generate(greedy(tokenizer, "hi", max_new_tokens=2)).completion_tokens <= 2
    finally:
        engine.close()


def test_numpy_or_torch_numbers_are_taken_as_python_numbers(engine, tokenizer) -> None:
    # Refused before: a seed drawn with numpy (np.random.default_rng().integers) was "not an integer",
    # a numpy float32 temperature or top_p "not a number".
    plain = engine.generate(greedy(tokenizer, PROMPTS[0], max_new_tokens=6, temperature=0.75, top_p=0.5, seed=11))
    for seed, limit in ((np.int64(11), np.int32(6)), (torch.tensor(11), torch.tensor(6))):
        # 0.75 and 0.5 are exact in float32: the same sampling as the Python floats.
        sampling = {"temperature": np.float32(0.75), "top_p": np.float32(0.5)}
        again = engine.generate(greedy(tokenizer, PROMPTS[0], max_new_tokens=limit, seed=seed, **sampling))
        assert again.token_ids == plain.token_ids


def test_top_p_zero_is_greedy_and_fails_no_other_row(engine, tokenizer) -> None:
    # Before the fix top_p=0 masked every token: multinomial raised and failed the whole batch step.
    alone = engine.generate(greedy(tokenizer, PROMPTS[0], max_new_tokens=6))
    futures = [
        engine.submit(
            GenerationRequest(ids(tokenizer, PROMPTS[0]), max_new_tokens=6, temperature=0.8, top_p=0.0, seed=3)
        ),
        engine.submit(greedy(tokenizer, PROMPTS[1], max_new_tokens=6)),
    ]
    nucleus, other = (f.result(timeout=60) for f in futures)
    assert nucleus.token_ids == alone.token_ids and other.completion_tokens > 0


def test_a_reply_that_ends_on_eos_is_kept_in_the_prefix_cache(plain, tokenizer) -> None:
    # The next turn's prompt starts with this one and its reply: before the fix a reply ending on EOS
    # (most chat turns) was never stored, so the next turn computed it again.
    first = plain.generate(greedy(tokenizer, PROMPTS[1], max_new_tokens=8)).token_ids
    k = next(i for i in range(2, len(first)) if first[i] not in first[:i])  # the first new token ends it
    model = tiny_llama(tokenizer)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, first[k]]
    engine = InferenceEngine(model, tokenizer)
    try:
        prompt = ids(tokenizer, PROMPTS[1])
        reply = engine.generate(greedy(tokenizer, PROMPTS[1], max_new_tokens=10))
        assert reply.finish_reason == "stop" and reply.token_ids == first[:k]
        assert engine.cache.match(prompt + reply.token_ids).length == len(prompt) + k
    finally:
        engine.close()


def test_a_request_that_cannot_start_fails_alone(model, tokenizer, monkeypatch) -> None:
    # Before the fix any error but RuntimeError/OverflowError in _start escaped the admission:
    # the requests admitted with it never resolved.
    from langgraph_parallelmuse.models import scheduler

    real = scheduler.RequestState

    def state(**kwargs):
        if kwargs["req"].max_new_tokens == 7:
            raise TypeError("this request is malformed")
        return real(**kwargs)

    monkeypatch.setattr(scheduler, "RequestState", state)
    engine = InferenceEngine(model, tokenizer, max_batch_size=4)
    try:
        good, bad, later = (engine.submit(greedy(tokenizer, PROMPTS[0], max_new_tokens=n)) for n in (5, 7, 6))
        with pytest.raises(TypeError, match="malformed"):
            bad.result(timeout=60)
        assert good.result(timeout=60).completion_tokens == 5 and later.result(timeout=60).completion_tokens == 6
    finally:
        engine.close()


def test_a_cache_bound_given_as_a_float_serves_requests_longer_than_it(model, tokenizer, plain) -> None:
    # cache_max_bytes=0.5 * 1024**3 is a float: a request whose KV exceeded the bound failed with a
    # TypeError, and so did every row decoding beside it when it retired.
    bound = 100.5 * ModelRunner(model).bytes_per_token
    engine = InferenceEngine(model, tokenizer, cache_max_bytes=bound)
    try:
        short = greedy(tokenizer, PROMPTS[1], max_new_tokens=150, ignore_eos=True)
        long = GenerationRequest(list(range(5, 155)), max_new_tokens=3, temperature=0.0)
        results = [future.result(timeout=60) for future in [engine.submit(short), engine.submit(long)]]
        assert engine.cache.nbytes <= bound
    finally:
        engine.close()
    assert [r.token_ids for r in results] == [plain.generate(short).token_ids, plain.generate(long).token_ids]


def test_a_failure_while_admitting_fails_those_requests_and_the_engine_goes_on(model, tokenizer, monkeypatch) -> None:
    from langgraph_parallelmuse.models.scheduler import Scheduler

    engine = InferenceEngine(model, tokenizer, max_batch_size=4)
    try:

        def broken(self, admitted):
            raise RuntimeError("joining the batch broke")

        monkeypatch.setattr(Scheduler, "_join", broken)
        # Admitted with them, a scored option is finished by its prefill: it never joins the batch,
        # so it keeps its result.
        option = ids(tokenizer, " the bees") + [tokenizer.eos_token_id]
        scored = engine.submit(GenerationRequest(ids(tokenizer, PROMPTS[0]), temperature=0.0, forced_ids=option))
        futures = [engine.submit(greedy(tokenizer, f"question {i}")) for i in range(2)]
        for future in futures:  # before the fix these stayed running forever (a timeout here)
            with pytest.raises(RuntimeError, match="joining the batch broke"):
                future.result(timeout=60)
        assert scored.result(timeout=60).token_ids == option
        monkeypatch.undo()
        assert engine.submit(greedy(tokenizer, "hello")).result(timeout=60).completion_tokens > 0
    finally:
        engine.close()


def test_a_transformers_release_below_the_floor_is_refused(model, tokenizer, monkeypatch) -> None:
    import transformers

    monkeypatch.setattr(transformers, "__version__", "5.23.0")
    with pytest.raises(ConfigError, match=r"transformers>=5\.24"):
        InferenceEngine(model, tokenizer)


def test_the_float32_runner_reads_the_model_weights_in_place(model) -> None:
    from langgraph_parallelmuse.models.runner import ModelRunner

    runner = ModelRunner(model)
    attn = model.model.layers[1].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == runner.layers[1].qkv.weight.untyped_storage().data_ptr()
    assert runner.head.weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()


def test_bfloat16_precision_stays_near_the_float32_reference(model, tokenizer) -> None:
    # Asked for explicitly it runs everywhere; on a CPU without native bfloat16 it warns (slow there).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = InferenceEngine(model, tokenizer, precision="bfloat16")
    assert any("precision='auto'" in str(w.message) for w in caught) == (not native_bfloat16())
    try:
        prompt = ids(tokenizer, PROMPTS[2])
        result = engine.generate(GenerationRequest(prompt, max_new_tokens=8, temperature=0.0, top_logprobs=3))
        stats = engine.stats()
    finally:
        engine.close()
    reference = teacher_forced(model, prompt, result.token_ids)
    for i, (entry, token) in enumerate(zip(result.logprobs, result.token_ids, strict=True)):
        # The random tiny model's logits are large, so bfloat16 moves them more than the real
        # model's (0.1 nats at most there); a wrong layout would be off by several nats.
        assert abs(entry["logprob"] - float(reference[i, token])) < 1.0
    # bfloat16 KV: two bytes per value in the prefix cache.
    positions = len(prompt) + len(result.token_ids) - 1
    assert stats["cache_bytes"] == positions * 2 * 2 * 2 * 16 * 2  # layers * (k, v) * kv_heads * head_dim * 2 B
    with pytest.raises(ConfigError, match="precision"):
        InferenceEngine(model, tokenizer, precision="float16")


@pytest.mark.parametrize(
    ("flags", "computes"),
    [({"avx2", "fma"}, torch.float32), ({"avx512f", "avx512_bf16"}, torch.bfloat16), ({"amx_bf16"}, torch.bfloat16)],
)
def test_auto_precision_is_bfloat16_only_where_the_cpu_has_it(model, tokenizer, monkeypatch, flags, computes) -> None:
    from langgraph_parallelmuse.models import hardware

    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    engine = InferenceEngine(model, tokenizer, precision="auto")
    try:
        assert engine.runner.dtype == computes
        assert resolve_precision("auto") == str(computes).removeprefix("torch.")
    finally:
        engine.close()


# ----------------------------------------------------------------------------- LocalChatModel's inputs


@pytest.fixture
def chat_model(engine, tokenizer, monkeypatch):
    from langgraph_parallelmuse.models import LocalChatModel

    monkeypatch.setattr(tokenizer, "chat_template", CHATML)
    llm = LocalChatModel(max_tokens=8, temperature=0.0)
    llm._engine = engine
    return llm


def test_a_stop_given_as_a_string_is_one_stop_not_its_letters(chat_model) -> None:
    """``tuple("ENDf")`` made four one-letter stops: the reply was cut at the first E, N, D or f."""
    from langchain_core.messages import HumanMessage

    messages = [HumanMessage("the cat is on the mat and")]
    as_list = chat_model.invoke(messages, stop=["ENDf"])
    assert chat_model.invoke(messages, stop="ENDf").content == as_list.content


def test_a_bad_stop_is_refused_before_it_reaches_a_batch(engine, tokenizer) -> None:
    """A stop that is not a string raised inside the worker's decode step, failing every row of the batch."""
    # A one-shot iterator passed the check, which used it up, and failed the whole batch in the worker.
    for stop in [("\n", 3), "END", iter(["zz"]), None]:
        with pytest.raises(InputError, match="pass a list of strings"):
            engine.submit(greedy(tokenizer, "hi", stop=stop))
    stop = ["zz"]
    running = engine.submit(greedy(tokenizer, PROMPTS[0], stop=stop, ignore_eos=True))
    stop.append(None)  # the caller's list, changed after submit: the request keeps what was sent
    assert running.result().completion_tokens == 12


def test_a_vanishing_temperature_is_greedy_and_fails_no_row(engine, tokenizer) -> None:
    """logits / 1e-45 overflowed to inf: the NaN failed the whole batch's draw."""
    alone = engine.generate(greedy(tokenizer, PROMPTS[0], max_new_tokens=6))
    futures = [
        engine.submit(GenerationRequest(ids(tokenizer, PROMPTS[0]), max_new_tokens=6, temperature=1e-45, seed=1)),
        engine.submit(greedy(tokenizer, PROMPTS[1], max_new_tokens=6)),
    ]
    cold, other = (f.result(timeout=60) for f in futures)
    assert cold.token_ids == alone.token_ids and other.completion_tokens > 0


def test_tool_calls_a_template_cannot_render_are_refused_not_dropped(chat_model, tokenizer, monkeypatch) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    call = {"name": "search", "args": {"query": "Eiffel"}, "id": "c1"}
    messages = [HumanMessage("Where is it?"), AIMessage("", tool_calls=[call]), ToolMessage("Paris", tool_call_id="c1")]
    with pytest.raises(InputError, match=r"does not render tool calls .*\['search'\]"):
        chat_model.render_prompt(messages)
    renders_calls = CHATML.replace(
        "{{ m['content'] }}",
        "{{ m['content'] }}{% for c in m.get('tool_calls', []) %}<call>{{ c['function']['name'] }}</call>{% endfor %}",
    )
    monkeypatch.setattr(tokenizer, "chat_template", renders_calls)
    assert "<call>search</call>" in chat_model.render_prompt(messages)


def test_max_tokens_none_is_the_models_bound_and_an_empty_prefill_alone_is_refused(chat_model) -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    reply = chat_model.invoke([HumanMessage("once upon a time")], max_tokens=None, stop=[])
    assert 0 < reply.usage_metadata["output_tokens"] <= chat_model.max_tokens
    with pytest.raises(InputError, match="no messages left"):
        chat_model.invoke([AIMessage("")])


def test_token_ids_of_any_integer_type_are_taken_and_others_refused_at_submit(engine, tokenizer) -> None:
    # A float id passed the vocabulary check and failed in the worker, with every request of its
    # batch; a numpy prompt failed at submit ("truth value of an array is ambiguous").
    prompt, option = ids(tokenizer, PROMPTS[0]), ids(tokenizer, " the bees")
    with pytest.raises(InputError, match=r"forced_ids holds 5\.0: pass a list of integer token ids"):
        engine.submit(GenerationRequest(prompt, forced_ids=[5.0]))
    with pytest.raises(InputError, match=r"prompt_ids holds \d+\.0"):
        engine.submit(GenerationRequest([float(t) for t in prompt]))
    with pytest.raises(InputError, match=r"forced_ids holds tensor\(5\.\)"):
        engine.submit(GenerationRequest(prompt, forced_ids=torch.tensor([5.0])))
    # A bool is an int to Python: True was taken as token id 1.
    with pytest.raises(InputError, match=r"forced_ids holds True"):
        engine.submit(GenerationRequest(prompt, forced_ids=[True]))
    scored = engine.generate(GenerationRequest(prompt, temperature=0.0, top_logprobs=2, forced_ids=option))
    for forced in (np.array(option), torch.tensor(option)):
        again = engine.generate(GenerationRequest(np.array(prompt), temperature=0.0, top_logprobs=2, forced_ids=forced))
        assert again.token_ids == option and again.prompt_tokens == len(prompt)
        for entry, reference in zip(again.logprobs, scored.logprobs, strict=True):
            assert abs(entry["logprob"] - reference["logprob"]) < LOGPROB_TOL


def test_a_bad_request_the_checks_missed_fails_no_running_row_and_no_scored_one(
    model, tokenizer, plain, monkeypatch
) -> None:
    # Put on the queue past submit's checks: before the fix a bad scored row raised outside the
    # prefill's guard and the worker failed every running and admitted request with it. A bad
    # sampled row still fails the sampled rows admitted in its round (their first token is one
    # step), never a running row or a scored request.
    from langgraph_parallelmuse.models.requests import RequestFuture

    engine = InferenceEngine(model, tokenizer, batch_window=0.0)
    slow_steps(engine, monkeypatch)
    running = greedy(tokenizer, PROMPTS[2], max_new_tokens=30, ignore_eos=True)
    option = ids(tokenizer, " the bees")
    good = GenerationRequest(ids(tokenizer, PROMPTS[0]), temperature=0.0, forced_ids=option)
    bad_scored = GenerationRequest(ids(tokenizer, PROMPTS[1]), temperature=0.0, forced_ids=[5.0])
    bad_sampled = GenerationRequest(ids(tokenizer, PROMPTS[3]), temperature=0.7, top_p=None)
    try:
        victim = engine.submit(running)
        while engine.stats()["decode_tokens"] < 2:
            time.sleep(0.005)
        futures = [RequestFuture() for _ in range(3)]
        for request, future in zip((bad_scored, good, bad_sampled), futures, strict=True):
            engine._queue.put((request, future))
        for future in (futures[0], futures[2]):
            assert future.exception(timeout=60) is not None
        assert futures[1].result(timeout=60).token_ids == option
        assert victim.result(timeout=60).token_ids == plain.generate(running).token_ids
    finally:
        engine.close()


def test_an_on_text_that_raises_fails_its_request_alone(model, tokenizer, plain) -> None:
    # Raised out of the decode step, the callback's error failed every request of the batch (the
    # first piece streams in the admission round, so a raise there failed all rows admitted with it).
    engine = InferenceEngine(model, tokenizer, batch_window=0.5)
    pieces = []

    def fails_on_third_piece(text: str) -> None:
        pieces.append(text)
        if len(pieces) == 3:
            raise ValueError("the caller's callback broke")

    def fails_at_once(text: str) -> None:
        raise ValueError("the caller's callback broke")

    others = [
        greedy(tokenizer, PROMPTS[0], max_new_tokens=20, ignore_eos=True),
        GenerationRequest(ids(tokenizer, PROMPTS[2]), max_new_tokens=20, temperature=0.9, seed=7, ignore_eos=True),
        GenerationRequest(ids(tokenizer, PROMPTS[1]), temperature=0.0, forced_ids=ids(tokenizer, " the bees")),
    ]
    failing = [
        greedy(tokenizer, PROMPTS[3], max_new_tokens=20, ignore_eos=True, on_text=fails_on_third_piece),
        greedy(tokenizer, PROMPTS[1], max_new_tokens=20, ignore_eos=True, on_text=fails_at_once),
    ]
    try:
        futures = [engine.submit(request) for request in [*others, *failing]]
        results = [future.result(timeout=60) for future in futures[: len(others)]]
        errors = [future.exception(timeout=60) for future in futures[len(others) :]]
        assert engine.generate(others[0]).token_ids == results[0].token_ids  # and the engine goes on
    finally:
        engine.close()
    assert all(isinstance(error, ValueError) for error in errors) and len(pieces) == 3
    for request, result in zip(others, results, strict=True):
        assert result.token_ids == plain.generate(request).token_ids


def test_the_exit_hook_drops_the_requests_nobody_will_read(model, tokenizer, monkeypatch) -> None:
    # A script that ended after submitting waited in the exit hook until every queued request was
    # generated (minutes at real budgets); a plain close() still serves the queue.
    from langgraph_parallelmuse.models import engine as engine_module

    engine = InferenceEngine(model, tokenizer, max_batch_size=1)
    slow_steps(engine, monkeypatch)
    request = GenerationRequest(ids(tokenizer, PROMPTS[0]), max_new_tokens=200, ignore_eos=True)
    futures = [engine.submit(request) for _ in range(3)]
    while engine.stats()["decode_tokens"] < 2:
        time.sleep(0.005)
    monkeypatch.setattr(engine_module, "_live_engines", weakref.WeakSet([engine]))  # not the other tests'
    engine_module._close_all()
    with pytest.raises(CancelledError, match="cancelled by its caller"):
        futures[0].result(timeout=0)
    assert all(f.cancelled() for f in futures[1:]) and engine.stats()["decode_tokens"] < 100
    served = InferenceEngine(model, tokenizer, max_batch_size=1)
    futures = [served.submit(greedy(tokenizer, p, max_new_tokens=3, ignore_eos=True)) for p in PROMPTS]
    served.close()
    assert [f.result(timeout=0).completion_tokens for f in futures] == [3] * len(PROMPTS)


def test_a_close_cancelling_after_one_on_the_worker_drops_the_queue_and_waits(model, tokenizer, monkeypatch) -> None:
    # A close() on the worker returns at once; the exit hook's close(cancel_pending=True) that followed
    # returned at once too (already closed): the worker went on decoding through interpreter teardown.
    engine = InferenceEngine(model, tokenizer, max_batch_size=1)
    slow_steps(engine, monkeypatch)
    first = engine.submit(greedy(tokenizer, PROMPTS[1], max_new_tokens=2))
    first.add_done_callback(lambda _: engine.close())
    queued = [engine.submit(greedy(tokenizer, PROMPTS[0], max_new_tokens=200, ignore_eos=True)) for _ in range(3)]
    first.result(timeout=60)
    engine.close(cancel_pending=True)
    assert not engine._thread.is_alive() and all(f.done() for f in queued)
    assert engine.stats()["decode_tokens"] < 300


def test_sentencepiece_logprob_bytes_are_the_tokens_own(monkeypatch) -> None:
    # Read in the byte-level alphabet, "<0x0A>" was its six letters, and "▁the" decoded alone lost
    # its space: normalize_logprobs, which trusts bytes for offsets, put regions on the wrong tokens.
    sp = tiny_sentencepiece_tokenizer()
    info = Decoder(sp, frozenset()).token_info
    piece = sp.convert_tokens_to_ids
    assert info(piece("▁the")) == (" the", list(b" the")) and info(piece("at")) == ("at", list(b"at"))
    assert info(piece("<0x0A>")) == ("\n", [10]) and info(piece("<0xC3>")) == ("\ufffd", [0xC3])
    engine = InferenceEngine(tiny_llama(sp), sp)
    try:
        forced = sp(" the cat\nsat é", add_special_tokens=False).input_ids
        result = engine.generate(GenerationRequest(sp("the cat").input_ids, forced_ids=forced, top_logprobs=3))
    finally:
        engine.close()
    assert result.text == "  the cat\nsat é"
    assert b"".join(bytes(e["bytes"]) for e in result.logprobs) == result.text.encode()
    for top in (t for e in result.logprobs for t in e["top_logprobs"]):
        assert bytes(top["bytes"]).decode("utf-8", "replace") == top["token"]


def test_byte_level_logprob_bytes_are_read_from_the_byte_alphabet(tokenizer) -> None:
    # The byte-level path (SmolLM2, the default) is unchanged: every piece maps back to its bytes.
    info = Decoder(tokenizer, frozenset()).token_info
    byte_of = byte_decoder()
    for token_id in range(len(tokenizer)):
        raw = [byte_of[ch] for ch in tokenizer.convert_ids_to_tokens(token_id)]
        assert info(token_id) == (bytes(raw).decode("utf-8", "replace"), raw)
