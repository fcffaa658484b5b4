"""The running batch's KV: rows share what they read, and hold no more memory than they read."""

from __future__ import annotations

import gc
import random

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef

from langgraph_parallelmuse.models import kv_batch
from langgraph_parallelmuse.models.kv_batch import BatchKV, Piece
from langgraph_parallelmuse.models.prefix_cache import PrefixCache

LAYERS, HEADS, KV_HEADS, DIM = 2, 4, 2, 8
SLOTS = 2 * LAYERS
POSITION_BYTES = SLOTS * KV_HEADS * DIM * 4  # one position of every slot, float32


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    # Tensors this small gain nothing from threads; on a busy machine their handoffs made each
    # attention call take 10 ms instead of 0.1.
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def state(n: int) -> tuple[torch.Tensor, ...]:
    """A state as the engine builds one: a tensor per slot, created together."""
    return tuple(torch.randn(1, KV_HEADS, n, DIM) for _ in range(SLOTS))


def first(source: tuple[torch.Tensor, ...], n: int) -> Piece:
    """The first ``n`` positions of ``source``, as views (what a split cache edge hands out)."""
    return tuple(t[..., :n, :] for t in source), n


class Checked:
    """A batch plus each row's keys and values, to check its attention against the concatenation."""

    def __init__(self) -> None:
        self.batch = BatchKV(num_layers=LAYERS, kv_heads=KV_HEADS, head_dim=DIM, dtype=torch.float32)
        self.rows: list[list[torch.Tensor]] = []  # per row, per slot: [1, Hkv, positions, D] (copies)

    def add(self, rows: list[list[Piece]]) -> None:
        self.batch.add(rows)
        for pieces in rows:
            self.rows.append([torch.cat([s[i][..., :n, :] for s, n in pieces], dim=-2) for i in range(SLOTS)])

    def remove(self, rows: list[int]) -> None:
        order = self.batch.remove(rows)
        self.rows = [self.rows[i] for i in order]

    def step(self) -> None:
        """One decode step of every row, each checked against attention over its positions concatenated."""
        q = torch.randn(len(self.rows), HEADS, 1, DIM)
        new = [torch.randn(len(self.rows), KV_HEADS, 1, DIM) for _ in range(SLOTS)]
        for layer in range(LAYERS):
            out = self.batch.attend(layer, q, new[2 * layer], new[2 * layer + 1])
            for r, slots in enumerate(self.rows):
                k, v = (torch.cat([slots[i], new[i][r : r + 1]], dim=-2) for i in (2 * layer, 2 * layer + 1))
                expected = F.scaled_dot_product_attention(q[r : r + 1], k, v, enable_gqa=True)
                assert torch.allclose(out[r : r + 1], expected, atol=1e-5)
        self.batch.advance()
        for r, slots in enumerate(self.rows):
            slots[:] = [torch.cat([slots[i], new[i][r : r + 1]], dim=-2) for i in range(SLOTS)]


def held_bytes(batch: BatchKV) -> int:
    """Bytes of the distinct storages the batch's segments keep alive."""
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for s in batch.segments.values() for t in s.state
    }
    return sum(storages.values())


def read_bytes(batch: BatchKV) -> int:
    """Bytes of the positions the batch's segments hold."""
    return sum(t.numel() * t.element_size() for s in batch.segments.values() for t in s.state)


def test_rows_reading_a_small_part_of_a_storage_share_one_copy_of_that_part() -> None:
    # Two branches forked 10 positions into a 40-position edge: their views pinned all 40, which the
    # prefix cache stops counting once it evicts the edge.
    history = state(40)
    checked = Checked()
    checked.add([[first(history, 10), (state(2), 2)], [first(history, 10), (state(3), 3)]])
    assert held_bytes(checked.batch) == read_bytes(checked.batch) == 10 * POSITION_BYTES
    checked.step()
    # A later branch brings views of the same storage: it reads the copy the others read.
    checked.add([[first(history, 6), (state(1), 1)]])
    assert checked.batch.shared_positions == 10
    assert held_bytes(checked.batch) == 10 * POSITION_BYTES
    checked.step()
    # A row reading all of it holds the storage anyway: every row reads the storage again, the copy goes.
    checked.add([[first(history, 40)]])
    assert checked.batch.shared_positions == 40
    assert held_bytes(checked.batch) == 40 * POSITION_BYTES
    assert {s.state[0].untyped_storage().data_ptr() for s in checked.batch.segments.values()} == {
        history[0].untyped_storage().data_ptr()
    }
    checked.step()
    checked.remove([3])  # it leaves: the rest read 10 positions of 40 again
    assert held_bytes(checked.batch) == 10 * POSITION_BYTES
    checked.step()


def _branch_left_alone(monkeypatch) -> tuple[Checked, PrefixCache, StorageWeakRef, tuple]:
    """A parent and a branch forked 10 positions into its 40-position prompt decode; the parent
    ends, and the cache evicts the prompt's edges. Returns the batch, the cache, a weak reference
    to the prompt's storage and the storage's key in the batch."""
    monkeypatch.setattr(kv_batch, "_SEGMENT_MIN", 8)  # the parent's own 30 positions stay a segment too
    cache = PrefixCache(max_bytes=60 * POSITION_BYTES)
    prompt = list(range(40))
    own = state(40)
    cache.insert(prompt, own, adopt=True)
    source, key = StorageWeakRef(own[0].untyped_storage()), kv_batch._span((own, 40))[0]
    cache.insert([*range(10), 100, 101], state(2), start=10, adopt=True)  # splits the edge after 10
    checked = Checked()
    checked.add([list(cache.match(prompt).pieces), list(cache.match([*range(10), 100, 101]).pieces)])
    del own
    checked.step()
    checked.remove([0])  # the parent ends
    checked.step()
    cache.insert(list(range(200, 230)), state(30))  # the prompt's 30 positions past the fork are evicted
    assert cache.num_tokens == 10 + 2 + 30
    cache.insert(list(range(300, 330)), state(30))  # and then the branch's edges
    assert cache.num_tokens == 30 + 30 and cache.match(prompt).length == 0
    gc.collect()
    return checked, cache, source, key


def test_a_storage_the_cache_evicted_is_freed_while_a_branch_still_reads_part_of_it(monkeypatch) -> None:
    checked, _, source, _ = _branch_left_alone(monkeypatch)
    assert source.expired()  # the batch holds a copy of the 10 positions it reads, not the 40
    assert held_bytes(checked.batch) == 10 * POSITION_BYTES
    checked.step()
    checked.add([[(state(3), 3)]])
    checked.step()


def test_a_freed_storage_address_given_to_new_kv_is_not_taken_for_the_copy(monkeypatch) -> None:
    # Once the copied storage is freed its address may hold other KV: a piece there must not read the copy.
    checked, _, source, key = _branch_left_alone(monkeypatch)
    assert source.expired()
    impostor = state(10)
    span = kv_batch._span

    def reused(piece: Piece):  # what the allocator may do: the new KV at the freed storage's address
        return (
            (key, *span(piece)[1:])
            if piece[0][0].untyped_storage().data_ptr() == impostor[0].data_ptr()
            else span(piece)
        )

    monkeypatch.setattr(kv_batch, "_span", reused)
    checked.add([[first(impostor, 10), (state(1), 1)], [first(impostor, 10), (state(2), 2)]])
    checked.step()  # the new rows read the new KV, the branch its copy


def test_two_freed_storages_whose_copy_sits_at_the_others_address_are_both_renamed(monkeypatch) -> None:
    """One copy may be given the address of another copied storage already freed: renamed one at a
    time, the first took the second's name and its segment, and the batch lost a segment (or raised)."""
    monkeypatch.setattr(kv_batch, "_SEGMENT_MIN", 8)
    checked = Checked()
    a, x = state(400), state(40)
    checked.add([[first(a, 40), (state(1), 1)], [first(a, 40), (state(2), 2)]])  # 40 of 400 read: copied
    checked.add([[first(x, 10), (state(1), 1)], [first(x, 10), (state(3), 3)]])  # 10 of 40 read: copied
    key_a, key_x = kv_batch._span(first(a, 1))[0], kv_batch._span(first(x, 1))[0]
    copy_a = checked.batch.segments[key_a, 0].state[0].untyped_storage().data_ptr()
    del a, x
    gc.collect()
    span = kv_batch._span

    def reused(piece: Piece):  # what the allocator may do: x's freed address given to a's copy
        got = span(piece)
        return (key_x, *got[1:]) if piece[0][0].untyped_storage().data_ptr() == copy_a else got

    monkeypatch.setattr(kv_batch, "_span", reused)
    checked.add([[(state(3), 3)]])
    assert sorted(s.length for s in checked.batch.segments.values()) == [10, 40]
    checked.step()


def test_rows_leaving_give_back_the_private_rows_they_needed() -> None:
    """The private buffer shrank in positions when long rows left, never in rows: 32 rows joining
    and 31 leaving kept 32 rows of buffer (42x the positions in use)."""
    checked = Checked()
    checked.add([[(state(200), 200)] for _ in range(32)])
    checked.remove(list(range(1, 32)))
    assert checked.batch.keys.shape[1] <= 2 * 1 + 8
    checked.step()


def test_a_long_decode_copies_its_private_row_a_number_of_times_linear_in_its_length() -> None:
    """The buffer grew by a fixed 64 positions: 2,000 decoded tokens copied it 31 times, 30,495
    positions in all (15x the tokens, and quadratic in the length); the buffer stays near the row."""
    batch = BatchKV(num_layers=1, kv_heads=KV_HEADS, head_dim=DIM, dtype=torch.float32)
    batch.add([[(state(10), 10)]])
    q, kv = torch.randn(1, HEADS, 1, DIM), torch.randn(1, KV_HEADS, 1, DIM)
    buffer, copied, steps = batch.keys, 0, 2000
    for _ in range(steps):
        batch.attend(0, q, kv, kv)
        batch.advance()
        if batch.keys is not buffer:
            copied += buffer.shape[3]
            buffer = batch.keys
    assert copied <= 4 * steps
    assert batch.keys.shape[3] <= 1.5 * (10 + steps) + kv_batch._GROWTH


def test_random_joins_leaves_and_evictions_read_each_position_once_and_hold_at_most_twice_what_they_read(
    monkeypatch,
) -> None:
    """Rows of shared random prompts join (as cache views, as the engine's do) and leave while the
    cache evicts; every step's attention equals attention over each row's positions concatenated."""
    monkeypatch.setattr(kv_batch, "_SEGMENT_MIN", 8)
    rng = random.Random(0)
    cache = PrefixCache(max_bytes=160 * POSITION_BYTES)
    checked = Checked()
    prompts = [[rng.randrange(50) for _ in range(40)] for _ in range(3)]
    for _ in range(150):
        if checked.rows and rng.random() < 0.35:
            checked.remove(rng.sample(range(len(checked.rows)), rng.randint(1, len(checked.rows))))
        else:
            rows = []
            for _ in range(rng.randint(1, 3)):
                # Prefixes of a few long prompts, each with a short suffix of its own: rows read
                # shorter and longer parts of the same edges, split at many depths.
                tokens = rng.choice(prompts)[: rng.randint(2, 40)] + [
                    rng.randrange(50) for _ in range(rng.randint(1, 3))
                ]
                hit = cache.match(tokens, len(tokens) - 1)
                fresh = state(len(tokens) - hit.length)
                cache.insert(tokens, fresh, start=hit.length, adopt=True)
                again = cache.match(tokens)
                pieces = again.pieces if again.length == len(tokens) else (*hit.pieces, (fresh, fresh[0].shape[-2]))
                rows.append(list(pieces))
            checked.add(rows)
        batch = checked.batch
        for row, offset in enumerate(batch.offsets):
            assert sum(s.length for s in batch.segments.values() if row in s.rows) == offset
        groups: dict = {}
        for segment in batch.segments.values():
            groups.setdefault(segment.storage, []).append(segment)
        for group in groups.values():
            hull = max(s.start + s.length for s in group) - min(s.start for s in group)
            t = group[0].state[0]
            assert t.untyped_storage().nbytes() <= 2 * hull * KV_HEADS * DIM * t.element_size()
        if checked.rows:
            checked.step()
