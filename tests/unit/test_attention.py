"""Attention over KV parts (shared segments + private rows) equals attention over the concatenation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from langgraph_parallelmuse.models.attention import decode_attention, flash, prefill_attention
from langgraph_parallelmuse.models.kv_batch import BatchKV

HEADS, KV_HEADS, DIM = 6, 2, 8
TOL = 1e-5


def kv(n: int, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, KV_HEADS, n, DIM), torch.randn(batch, KV_HEADS, n, DIM)


def reference(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """One row's attention over its parts concatenated (``q``: ``[1, H, L, D]``)."""
    return F.scaled_dot_product_attention(q, torch.cat(keys, dim=-2), torch.cat(values, dim=-2), enable_gqa=True)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_flash_folds_rows_over_a_shared_part_and_returns_the_log_sum_exp() -> None:
    q = torch.randn(3, HEADS, 1, DIM)
    k, v = kv(5)
    out, lse = flash(q, k, v)
    for row in range(3):
        assert torch.allclose(out[row : row + 1], reference(q[row : row + 1], [k], [v]), atol=TOL)
    scores = (q.view(3, KV_HEADS, 3, DIM) @ k.transpose(-1, -2)) / DIM**0.5
    assert torch.allclose(lse, torch.logsumexp(scores, dim=-1).view(3, HEADS, 1), atol=TOL)


def test_decode_attention_combines_private_rows_and_shared_segments() -> None:
    rows, lengths = 4, [3, 1, 4, 2]
    q = torch.randn(rows, HEADS, 1, DIM)
    everyone, some = kv(7), kv(5)
    private = kv(4, rows)
    mask = torch.zeros(rows, 1, 1, 4)
    for i, n in enumerate(lengths):
        mask[i, ..., n:] = float("-inf")
    out = decode_attention(q, (*private, mask), [(*everyone, None), (*some, torch.tensor([1, 2]))])
    for i, n in enumerate(lengths):
        parts = [
            everyone,
            *([some] if i in (1, 2) else []),
            (private[0][i : i + 1, :, :n], private[1][i : i + 1, :, :n]),
        ]
        expected = reference(q[i : i + 1], [p[0] for p in parts], [p[1] for p in parts])
        assert torch.allclose(out[i : i + 1], expected, atol=TOL)


def test_prefill_attention_is_causal_over_the_chunk_and_full_over_its_prefix() -> None:
    q = torch.randn(1, HEADS, 5, DIM)
    k, v = kv(5)
    prefix = [kv(7), kv(3)]
    out = prefill_attention(q, k, v, prefix)
    keys = torch.cat([prefix[0][0], prefix[1][0], k], dim=-2)
    values = torch.cat([prefix[0][1], prefix[1][1], v], dim=-2)
    visible = torch.ones(5, 15, dtype=torch.bool).tril(10)
    expected = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, enable_gqa=True)
    assert torch.allclose(out, expected, atol=TOL)


def state_of(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    return tuple(t for pair in layers for t in pair)


def test_batch_kv_shares_common_pieces_and_decodes_each_row_over_its_own_positions() -> None:
    layers = 2
    common = state_of([kv(6) for _ in range(layers)])
    own = [state_of([kv(n) for _ in range(layers)]) for n in (2, 3, 4)]
    batch = BatchKV(num_layers=layers, kv_heads=KV_HEADS, head_dim=DIM, dtype=torch.float32)
    batch.add([[(common, 6), (own[0], 2)], [(common, 6), (own[1], 3)]])
    batch.add([[(own[2], 4)]])  # alone: all private
    assert batch.shared_positions == 6
    assert batch.positions().tolist() == [8, 9, 4]
    pieces = {0: [common, own[0]], 1: [common, own[1]], 2: [own[2]]}
    history = {
        row: [[(s[2 * i], s[2 * i + 1]) for s in states] for i in range(layers)] for row, states in pieces.items()
    }

    def step(rows: list[int]) -> None:
        q = torch.randn(len(rows), HEADS, 1, DIM)
        new = [kv(1, len(rows)) for _ in range(layers)]
        for layer in range(layers):
            out = batch.attend(layer, q, *new[layer])
            for i, row in enumerate(rows):
                history[row][layer].append((new[layer][0][i : i + 1], new[layer][1][i : i + 1]))
                keys, values = zip(*history[row][layer], strict=True)
                assert torch.allclose(out[i : i + 1], reference(q[i : i + 1], list(keys), list(values)), atol=TOL)
        batch.advance()

    step([0, 1, 2])
    order = batch.remove([0])  # the last row moves into the hole
    assert order == [2, 1]
    step(order)
    start, state = batch.row_state(0)  # former row 2: nothing shared
    assert start == 0 and state[0].shape[-2] == 6
    keys = torch.cat([k for k, _ in history[2][0]], dim=-2)
    assert torch.equal(state[0], keys)
    start, state = batch.row_state(1)  # former row 1: the common piece is shared, the rest private
    assert start == 6 and state[2].shape[-2] == 5


def test_a_long_piece_of_one_row_is_read_in_place_not_copied() -> None:
    history = state_of([kv(300)])
    batch = BatchKV(num_layers=1, kv_heads=KV_HEADS, head_dim=DIM, dtype=torch.float32)
    batch.add([[(history, 300), (state_of([kv(2)]), 2)]])
    assert batch.shared_positions == 300 and batch.lengths == [2]
    assert batch.keys.shape[3] < 300  # the private buffer holds the short tail only
    q, new = torch.randn(1, HEADS, 1, DIM), kv(1)
    out = batch.attend(0, q, *new)
    private = batch.row_state(0)[1]
    expected = reference(q, [history[0], private[0][:, :, :2], new[0]], [history[1], private[1][:, :, :2], new[1]])
    assert torch.allclose(out, expected, atol=TOL)


def test_a_long_run_of_short_pieces_is_gathered_at_its_size_not_padded_into_the_private_buffer() -> None:
    # A conversation's turns are separate cache edges, each short; a neighbour row is short.
    system = state_of([kv(40)])
    turns = [state_of([kv(n)]) for n in (100, 90, 120)]
    batch = BatchKV(num_layers=1, kv_heads=KV_HEADS, head_dim=DIM, dtype=torch.float32)
    batch.add([[(system, 40), *((t, t[0].shape[-2]) for t in turns)], [(system, 40), (state_of([kv(3)]), 3)]])
    assert batch.offsets == [350, 40] and batch.lengths == [0, 3]
    assert batch.keys.shape[3] < 100  # capacity follows the short row, not the 310-position tail
    q, new = torch.randn(2, HEADS, 1, DIM), kv(1, 2)
    out = batch.attend(0, q, *new)
    keys = [system[0], *(t[0] for t in turns), new[0][:1]]
    values = [system[1], *(t[1] for t in turns), new[1][:1]]
    assert torch.allclose(out[:1], reference(q[:1], keys, values), atol=TOL)
    batch.advance()
    start, state = batch.row_state(0)  # what the cache stores after the row ends: its decoded positions
    assert start == 350 and state[0].shape[-2] == 1 and torch.equal(state[0], new[0][:1])


def test_rows_reading_different_prefixes_of_one_storage_read_each_position_once() -> None:
    # Branches forked at two depths of a running row bring views of its storage (the prefix cache
    # splits edges into views): the segment is cut where they part instead of copied per row.
    history = state_of([kv(300)])
    batch = BatchKV(num_layers=1, kv_heads=KV_HEADS, head_dim=DIM, dtype=torch.float32)
    batch.add([[(history, 300)]])
    for depth in (200, 100):
        batch.add([[(tuple(t[..., :depth, :] for t in history), depth), (state_of([kv(2)]), 2)]])
    assert batch.shared_positions == 300 and len(batch.segments) == 3
    assert batch.positions().tolist() == [300, 202, 102]

    def check(depths: list[int]) -> None:
        q, new = torch.randn(len(depths), HEADS, 1, DIM), kv(1, len(depths))
        out = batch.attend(0, q, *new)
        for row, depth in enumerate(depths):
            _, private = batch.row_state(row)
            n = batch.lengths[row]
            keys = [history[0][..., :depth, :], private[0][..., :n, :], new[0][row : row + 1]]
            values = [history[1][..., :depth, :], private[1][..., :n, :], new[1][row : row + 1]]
            assert torch.allclose(out[row : row + 1], reference(q[row : row + 1], keys, values), atol=TOL)
        batch.advance()

    check([300, 200, 100])
    assert batch.remove([0]) == [2, 1]  # the deepest branch's row moves into the hole
    # Left: [0, 100) read by both, [100, 200) by one; the boundary at 200 is gone with its row.
    assert sorted(s.length for s in batch.segments.values()) == [100, 100]
    check([100, 200])
    batch.remove([0])
    assert [s.length for s in batch.segments.values()] == [200]  # one row again: one segment, one read
    check([200])
