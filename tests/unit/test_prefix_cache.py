"""The radix prefix cache: longest-prefix lookup, splitting, LRU eviction, caller-owned copies."""

from __future__ import annotations

import pytest
import torch

from langgraph_parallelmuse.models.prefix_cache import PrefixCache

BYTES_PER_TOKEN = 2 * 4 * 4  # two float32 slots of head_dim 4


def kv(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Fake per-layer KV whose values encode the token ids, so slices are checkable."""
    base = torch.tensor(tokens, dtype=torch.float32)[None, None, :, None].expand(1, 1, -1, 4)
    return base.clone(), -base.clone()


def assert_state_is(state: tuple[torch.Tensor, ...], tokens: list[int]) -> None:
    expected = kv(tokens)
    assert len(state) == 2
    for got, want in zip(state, expected, strict=True):
        assert torch.equal(got, want)


def test_miss_on_empty_cache() -> None:
    cache = PrefixCache(1 << 20)
    hit = cache.match([1, 2, 3])
    assert hit.length == 0 and hit.concatenated() == ()


def test_longest_prefix_and_partial_edge() -> None:
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    hit = cache.match([1, 2, 3, 4, 5])
    assert hit.length == 4
    assert_state_is(hit.concatenated(), [1, 2, 3, 4])
    hit = cache.match([1, 2, 9])
    assert hit.length == 2
    assert_state_is(hit.concatenated(), [1, 2])
    assert cache.match([7, 1, 2]).length == 0


def test_max_length_caps_the_hit() -> None:
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    hit = cache.match([1, 2, 3], max_length=2)
    assert hit.length == 2
    assert_state_is(hit.concatenated(), [1, 2])


def test_branching_shares_the_prefix() -> None:
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    cache.insert([1, 2, 5, 6, 7], kv([1, 2, 5, 6, 7]))
    # The shared [1, 2] is stored once: 4 + 3 positions, not 4 + 5.
    assert cache.num_tokens == 7
    assert cache.nbytes == 7 * BYTES_PER_TOKEN
    assert_state_is(cache.match([1, 2, 3, 4, 0]).concatenated(), [1, 2, 3, 4])
    assert_state_is(cache.match([1, 2, 5, 6, 7]).concatenated(), [1, 2, 5, 6, 7])
    assert_state_is(cache.match([1, 2, 5, 8]).concatenated(), [1, 2, 5])


def test_reinserting_a_cached_sequence_stores_nothing() -> None:
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    before = cache.nbytes
    cache.insert([1, 2], kv([1, 2]))
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    assert cache.nbytes == before


def test_returned_state_is_a_copy_the_caller_may_mutate() -> None:
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    hit = cache.match([1, 2, 3])
    for tensor in hit.concatenated():
        tensor.fill_(99.0)
    extended = torch.cat([hit.concatenated()[0], torch.zeros(1, 1, 2, 4)], dim=-2)
    extended.fill_(5.0)
    assert_state_is(cache.match([1, 2, 3]).concatenated(), [1, 2, 3])
    # Partial-edge hits are copies too.
    part = cache.match([1, 2, 7])
    part.concatenated()[0].fill_(-1.0)
    assert_state_is(cache.match([1, 2, 3]).concatenated(), [1, 2, 3])


def test_inserted_state_is_copied() -> None:
    cache = PrefixCache(1 << 20)
    state = kv([1, 2, 3])
    cache.insert([1, 2, 3], state)
    state[0].fill_(42.0)
    assert_state_is(cache.match([1, 2, 3]).concatenated(), [1, 2, 3])


def test_lru_eviction_under_the_byte_bound() -> None:
    cache = PrefixCache(max_bytes=8 * BYTES_PER_TOKEN)
    cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    cache.insert([5, 6, 7, 8], kv([5, 6, 7, 8]))
    assert cache.nbytes == 8 * BYTES_PER_TOKEN
    cache.match([1, 2, 3, 4])  # [1..4] is now more recent than [5..8]
    cache.insert([9, 10], kv([9, 10]))
    assert cache.nbytes <= cache.max_bytes
    assert cache.match([5, 6, 7, 8]).length == 0
    assert cache.match([1, 2, 3, 4]).length == 4
    assert cache.match([9, 10]).length == 2


def test_eviction_drops_leaves_before_their_shared_prefix() -> None:
    cache = PrefixCache(max_bytes=6 * BYTES_PER_TOKEN)
    cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    cache.insert([1, 2, 5, 6], kv([1, 2, 5, 6]))  # splits [1,2] off; total 6 positions
    cache.match([1, 2, 5, 6])
    cache.insert([1, 2, 5, 6, 7], kv([1, 2, 5, 6, 7]))  # needs one more: evicts leaf [3, 4]
    assert cache.nbytes <= cache.max_bytes
    assert cache.match([1, 2, 3, 4]).length == 2
    assert cache.match([1, 2, 5, 6, 7]).length == 5


def test_sequence_larger_than_the_bound_is_stored_partially() -> None:
    cache = PrefixCache(max_bytes=3 * BYTES_PER_TOKEN)
    cache.insert([1, 2, 3, 4, 5], kv([1, 2, 3, 4, 5]))
    assert cache.nbytes <= cache.max_bytes
    hit = cache.match([1, 2, 3, 4, 5])
    assert hit.length == 3
    assert_state_is(hit.concatenated(), [1, 2, 3])


def test_a_float_bound_is_whole_bytes_and_a_partial_store_still_works() -> None:
    # A bound written as 0.5 * 1024**3 is a float: a sequence larger than it raised a TypeError
    # (float slice bounds) instead of being stored up to what fits.
    cache = PrefixCache(max_bytes=3.5 * BYTES_PER_TOKEN)
    assert cache.max_bytes == int(3.5 * BYTES_PER_TOKEN)
    cache.insert([1, 2, 3, 4, 5], kv([1, 2, 3, 4, 5]))
    assert cache.match([1, 2, 3, 4, 5]).length == 3 and cache.nbytes <= cache.max_bytes


@pytest.mark.parametrize("bound", [-1, float("nan"), float("inf"), "1GB", None])
def test_a_bound_that_is_no_number_of_bytes_is_refused(bound) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(bound)


def test_zero_bound_stores_nothing_and_clear_empties() -> None:
    assert PrefixCache(0).match([1]).length == 0
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2], kv([1, 2]))
    cache.clear()
    assert cache.nbytes == 0 and cache.match([1, 2]).length == 0


def test_many_layers_and_mismatched_state_rejected() -> None:
    cache = PrefixCache(1 << 20)
    layers = (*kv([1, 2, 3]), *kv([1, 2, 3]))
    cache.insert([1, 2, 3], layers)
    assert len(cache.match([1, 2]).concatenated()) == 4
    with pytest.raises(ValueError, match="positions"):
        cache.insert([4, 5], kv([4, 5, 6]))


def test_a_shared_prefix_is_evicted_once_its_branches_are_gone() -> None:
    cache = PrefixCache(max_bytes=4 * BYTES_PER_TOKEN)
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    cache.insert([1, 2, 4], kv([1, 2, 4]))  # [1, 2] -> {[3], [4]}: four positions
    cache.insert([7, 8, 9], kv([7, 8, 9]))  # needs three: both branches, then their prefix
    assert cache.nbytes == 3 * BYTES_PER_TOKEN
    assert cache.match([1, 2]).length == 0
    assert_state_is(cache.match([7, 8, 9]).concatenated(), [7, 8, 9])


def test_the_newest_insert_survives_and_tree_stays_consistent() -> None:
    """Many overlapping inserts under a small bound: the byte count is what the tree holds."""
    import random

    rng = random.Random(0)
    cache = PrefixCache(max_bytes=24 * BYTES_PER_TOKEN)
    for _ in range(300):
        tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 9))]
        cache.insert(tokens, kv(tokens))
        assert cache.nbytes <= cache.max_bytes
        assert cache.nbytes == cache.num_tokens * BYTES_PER_TOKEN
        hit = cache.match(tokens)
        assert hit.length == len(tokens)
        assert_state_is(hit.concatenated(), tokens)


def test_match_returns_views_of_one_stored_entry() -> None:
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    first, second = cache.match([1, 2, 3, 9]), cache.match([1, 2, 3, 4, 5])
    assert first.length == 3 and [n for _, n in first.pieces] == [3]
    assert first.pieces[0][0] is second.pieces[0][0]  # the same stored tensors, not copies
    assert_state_is(first.concatenated(), [1, 2, 3])
    assert cache.match([7]).length == 0 and cache.match([7]).pieces == ()


def test_insert_of_a_continuation_takes_state_of_the_new_positions_only() -> None:
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    cache.insert([1, 2, 3, 4, 5], kv([4, 5]), start=3)
    assert_state_is(cache.match([1, 2, 3, 4, 5]).concatenated(), [1, 2, 3, 4, 5])
    # Positions before `start` that are not cached leave a gap: nothing is stored.
    cache.insert([8, 9, 10], kv([10]), start=2)
    assert cache.match([8, 9, 10]).length == 0
    with pytest.raises(ValueError, match="positions"):
        cache.insert([1, 2, 3, 4], kv([4, 5]), start=3)


def test_adopted_state_is_kept_without_a_copy() -> None:
    cache = PrefixCache(1 << 20)
    state = kv([1, 2, 3])
    cache.insert([1, 2, 3], state, adopt=True)
    assert cache.match([1, 2, 3]).pieces[0][0][0] is state[0]
    assert cache.nbytes == 3 * BYTES_PER_TOKEN
    # Only a whole tensor is adopted; a tail of it is copied so the rest is not pinned.
    cache.insert([1, 2, 3, 4, 5], kv([1, 2, 3, 4, 5]), adopt=True)
    assert cache.nbytes == 5 * BYTES_PER_TOKEN


def test_a_split_keeps_views_of_one_storage_and_eviction_frees_what_it_drops() -> None:
    # A running batch row reads the stored tensor of an edge; a branch that splits the edge must get
    # views of that same memory (not copies), or the row and the branch each hold the prefix.
    cache = PrefixCache(max_bytes=7 * BYTES_PER_TOKEN)
    state = kv([1, 2, 3, 4, 5])
    cache.insert([1, 2, 3, 4, 5], state, adopt=True)
    cache.insert([1, 2, 3, 9], kv([9]), start=3)  # splits [1..5] after 3
    upper = cache.match([1, 2, 3, 9]).pieces[0][0]
    lower = cache.match([1, 2, 3, 4, 5]).pieces[1][0]
    for half in (upper, lower):
        assert half[0].untyped_storage().data_ptr() == state[0].untyped_storage().data_ptr()
    assert cache.nbytes == 6 * BYTES_PER_TOKEN
    cache.match([1, 2, 3, 9])  # [4, 5] is now the least recently used leaf
    cache.insert([7, 8, 9], kv([7, 8, 9]))  # needs three: [4, 5] goes, its storage with it
    assert cache.nbytes == cache.num_tokens * BYTES_PER_TOKEN == 7 * BYTES_PER_TOKEN
    assert cache.match([1, 2, 3, 4, 5]).length == 3
    assert_state_is(cache.match([1, 2, 3, 9]).concatenated(), [1, 2, 3, 9])
    assert_state_is(cache.match([7, 8, 9]).concatenated(), [7, 8, 9])


def test_an_eviction_copies_no_survivor_it_evicts_next(monkeypatch) -> None:
    # Evicting the lower half of a split edge copied the upper half out of their storage, and the
    # same eviction then took the upper half too: that copy was thrown away.
    from langgraph_parallelmuse.models import prefix_cache

    copied: list[int] = []  # positions copied per call
    slice_ = prefix_cache._slice

    def counted(state, start: int, stop: int):
        copied.append(stop - start)
        return slice_(state, start, stop)

    monkeypatch.setattr(prefix_cache, "_slice", counted)
    cache = PrefixCache(max_bytes=4 * BYTES_PER_TOKEN)
    cache.insert([1, 2, 3], kv([1, 2, 3]), adopt=True)
    cache.insert([1, 2, 4], kv([4]), start=2)  # [1, 2] -> {[3], [4]}; [1, 2] and [3] share one storage
    copied.clear()
    cache.insert([7, 8, 9], kv([7, 8, 9]))  # needs three: [3], [4], then [1, 2] go
    assert copied == [3]  # the new entry only
    assert cache.nbytes == cache.num_tokens * BYTES_PER_TOKEN == 3 * BYTES_PER_TOKEN
    assert_state_is(cache.match([7, 8, 9]).concatenated(), [7, 8, 9])
    # An upper half the eviction spares is still copied out, once, so its storage's rest is freed.
    cache.insert([7, 5], kv([5]), start=1)  # [7] -> {[8, 9], [5]}: [7] and [8, 9] share one storage
    cache.match([7, 5])
    copied.clear()
    cache.insert([6], kv([6]))  # needs one: [8, 9] goes, [7] stays
    assert copied == [1, 1]  # [7] out of its storage, and the new entry
    assert cache.nbytes == cache.num_tokens * BYTES_PER_TOKEN == 3 * BYTES_PER_TOKEN
    assert_state_is(cache.match([7, 5]).concatenated(), [7, 5])
