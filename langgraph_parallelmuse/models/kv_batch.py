"""The KV of the running batch: shared prefix segments plus one private buffer row per request.

A request joins with the pieces of KV that cover its prompt (views of prefix-cache entries, or its
own prefill output). Pieces that another request of the batch also reads become *shared segments*:
they stay where they are and attention reads them once for all their rows. Segments are ranges of
a storage, not whole pieces: a branch forked deeper or shallower into a running row's prompt
brings a view of the same storage (the prefix cache splits edges into views), so the segment is cut
where the rows' ranges part and each position is still read once, by every row that covers it.
A long piece only one row reads (a conversation's cached history) stays where it is too, as that
row's own segment, and so does a long run of short pieces after it, gathered into one. The rest of
a row's pieces (a short tail), and every position it decodes, live in its row of the private
buffer ``[layers, rows, kv_heads, capacity, head_dim]``, whose capacity is the longest row's.
Nothing is copied per decode step (the new position is written in place); a leaving row is
replaced by the last row, so only that row's private positions move.

When the rows read less than half of a storage (a branch forked early into a long edge, or the
row that read the rest gone), the part they read is copied out: a view pins the whole storage,
which the prefix cache stops counting once it evicts the edge. The copy's segments are still found
by the storage they came from while it lives, so later rows that bring views of it share the copy.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from langgraph_parallelmuse.models.attention import decode_attention

__all__ = ["BatchKV", "Piece"]

#: ``(state, n)``: the first ``n`` positions of ``state = (k0, v0, k1, v1, ...)`` (``[1, Hkv, *, D]``).
Piece = tuple[tuple[torch.Tensor, ...], int]

# The private buffer's capacity grows by at least this many positions, and by half the positions
# needed when that is more: a fixed step copied the whole buffer every 64 decode steps (quadratic in
# the length: 31 copies, 1.4 GiB, for 2,000 tokens of one SmolLM2 row), half of it makes the copies
# a constant share of the positions written, for a buffer at most 1.5 times the longest row.
_GROWTH = 64
# A piece of one row this long stays a segment instead of being copied into the private buffer:
# one more attention call per layer costs less than the copy, and the buffer stays small.
_SEGMENT_MIN = 256


# Identities of pieces laid out unusually (never met in the engine): negative, so never an address.
_UNSHARED = itertools.count(1)

#: Which memory a state's positions live in: slot 0's ``(address, strides)``, positions counted from
#: the storage's start. Two pieces with the same storage read the same bytes at the same position.
Storage = tuple[int, tuple[int, ...]]


@dataclass(eq=False)
class _Segment:
    """Positions ``[start, start + length)`` of ``storage``, read in place by ``rows``."""

    # Views of exactly those positions: of ``storage`` itself (held, so its address stays its own),
    # or of a copy of them (``copied``; then ``BatchKV._sources`` tells whether the address still is).
    state: tuple[torch.Tensor, ...]
    length: int
    storage: Storage
    start: int
    rows: list[int] = field(default_factory=list)
    copied: bool = False


def _span(piece: Piece) -> tuple[Storage, int, int]:
    """``(storage, first position in it, positions)`` of a piece.

    Slot 0 alone names the storage: every state the engine builds (a prefill pass's KV, the prefix
    cache's copies and the views it splits them into, a gathered run) is one tensor per slot, all
    created together, and its views are cut at the same positions of every slot; so two pieces
    whose slot 0 reads one memory at one position read one memory at that position in every slot.
    (Reading all 2 x layers slots' identities made ``add`` take tens of milliseconds.)
    """
    state, n = piece
    t = state[0]
    step, offset = t.stride(-2), t.storage_offset()
    if step <= 0 or offset % step:
        return (-next(_UNSHARED), ()), 0, n  # a layout not cut along positions: shares with nobody
    return (t.untyped_storage().data_ptr(), t.stride()), offset // step, n


def _moved(state: tuple[torch.Tensor, ...], by: int, length: int) -> tuple[torch.Tensor, ...]:
    """Views of ``length`` positions starting ``by`` after ``state``'s first, in the same storage.

    They may reach past ``state``'s own ends, only ever onto positions another view of that memory
    covers (neighbouring segments joined, a storage's segments moved onto one memory), so they read
    computed KV; torch checks the bounds.
    """
    if by == 0 and state[0].shape[-2] == length:
        return state  # a whole cache edge, the common case: its views are already these (slots alike)
    return tuple(
        t.as_strided((*t.shape[:-2], length, t.shape[-1]), t.stride(), t.storage_offset() + by * t.stride(-2))
        for t in state
    )


def _gathered(pieces: Sequence[Piece]) -> Piece:
    """The pieces' positions copied into one fresh state, in order."""
    slots = len(pieces[0][0])
    state = tuple(torch.cat([s[i][..., :n, :] for s, n in pieces], dim=-2) for i in range(slots))
    return state, sum(n for _, n in pieces)


def _overlap(a: int, m: int, b: int, n: int) -> bool:
    """Whether positions ``[a, a + m)`` and ``[b, b + n)`` meet."""
    return a < b + n and b < a + m


class BatchKV:
    """KV of the rows decoded together, in the engine's layer layout.

    Args:
        num_layers: Decoder layers.
        kv_heads: Key/value heads per layer.
        head_dim: Size of one head.
        dtype: KV dtype.

    Example:
        >>> import torch
        >>> batch = BatchKV(num_layers=1, kv_heads=1, head_dim=2, dtype=torch.float32)
        >>> shared = (torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
        >>> batch.add([[(shared, 3)], [(shared, 3)]])
        >>> batch.positions().tolist(), batch.shared_positions
        ([3, 3], 3)
    """

    def __init__(self, *, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        self.num_layers, self.kv_heads, self.head_dim, self.dtype = num_layers, kv_heads, head_dim, dtype
        self.keys = torch.empty(num_layers, 0, kv_heads, 0, head_dim, dtype=dtype)
        self.values = torch.empty_like(self.keys)
        self.offsets: list[int] = []  # positions a row reads from shared segments
        self.lengths: list[int] = []  # positions in its private row
        self.segments: dict[tuple[Storage, int], _Segment] = {}  # by (storage, start); ranges never overlap
        self._groups: dict[Storage, list[_Segment]] = {}  # the segments again, by storage
        # Storages whose segments all read a copy: while one lives its address is its own, so a piece
        # with that address is a view of it; once it is freed the address may be given to another.
        self._sources: dict[Storage, StorageWeakRef] = {}
        self._plan: list[tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor | None]] | None = None
        self._mask: torch.Tensor | None = None
        self._write_at: tuple[torch.Tensor, torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def shared_positions(self) -> int:
        """Positions held once in shared segments (summed over segments)."""
        return sum(s.length for s in self.segments.values())

    def positions(self) -> torch.Tensor:
        """The position each row decodes next (``[rows]``)."""
        return torch.tensor([o + n for o, n in zip(self.offsets, self.lengths, strict=True)])

    def add(self, rows: Sequence[Sequence[Piece]]) -> None:
        """Append rows, each given by the pieces covering its positions in order."""
        self._forget_freed()
        rows = [[p for p in pieces if p[1] > 0] for pieces in rows]
        spans = [[_span(p) for p in pieces] for pieces in rows]
        claims: dict[Storage, list[tuple[int, int, int]]] = {}  # storage -> (row, start, n) of the new rows
        for r, row_spans in enumerate(spans):
            for storage, start, n in row_spans:
                claims.setdefault(storage, []).append((r, start, n))
        plans = []
        for r, pieces in enumerate(rows):
            shared = 0
            while shared < len(pieces) and self._stays(spans[r][shared], r, claims):
                shared += 1
            head, tail = list(zip(pieces[:shared], spans[r][:shared], strict=True)), pieces[shared:]
            if sum(n for _, n in tail) >= _SEGMENT_MIN:
                # A long run of short pieces (a conversation's turns, each its own cache edge) is
                # gathered once into a segment of its exact size: in the private buffer every row
                # is padded to the longest row (measured: 700 MiB allocated for 150 MiB of rows).
                gathered = _gathered(tail)
                head.append((gathered, _span(gathered)))
                tail = []
            plans.append((head, tail))
        first = len(self.lengths)
        self.offsets += [sum(piece[1] for piece, _ in head) for head, _ in plans]
        self.lengths += [0] * len(rows)
        self._reserve(max((sum(n for _, n in tail) for _, tail in plans), default=0))
        for row, (head, tail) in enumerate(plans, first):
            for piece, span in head:
                self._read(row, piece[0], span)
            for state, n in tail:
                self._write_row(row, state, n)
        self._settle()
        self._plan = None

    def _stays(self, span: tuple[Storage, int, int], r: int, claims: dict[Storage, list[tuple[int, int, int]]]) -> bool:
        """Whether a piece of new row ``r`` is read in place: long, or positions another row reads."""
        storage, start, n = span
        if n >= _SEGMENT_MIN:
            return True
        if any(_overlap(s.start, s.length, start, n) for s in self._groups.get(storage, ())):
            return True
        return any(other != r and _overlap(a, m, start, n) for other, a, m in claims[storage])

    def _read(self, row: int, state: tuple[torch.Tensor, ...], span: tuple[Storage, int, int]) -> None:
        """Make ``row`` read the piece's positions: the segments already there, new ones for the rest."""
        storage, start, n = span
        stop = start + n
        self._cut(storage, start)
        self._cut(storage, stop)
        group = self._groups.setdefault(storage, [])
        inside = sorted((s for s in group if start <= s.start < stop), key=lambda s: s.start)
        at = start
        for segment in [*inside, None]:
            end = stop if segment is None else segment.start
            if end > at:  # positions no segment holds yet: a new one on the piece's own views
                new = _Segment(_moved(state, at - start, end - at), end - at, storage, at, [row])
                self.segments[storage, at] = new
                group.append(new)
            if segment is not None:
                segment.rows.append(row)
                at = segment.start + segment.length

    def _cut(self, storage: Storage, at: int) -> None:
        """Split the segment of ``storage`` that holds positions on both sides of ``at``, if any."""
        for segment in self._groups.get(storage, ()):
            if segment.start < at < segment.start + segment.length:
                k = at - segment.start
                right = _Segment(
                    _moved(segment.state, k, segment.length - k),
                    segment.length - k,
                    storage,
                    at,
                    list(segment.rows),
                    segment.copied,
                )
                segment.state, segment.length = _moved(segment.state, 0, k), k
                self.segments[storage, at] = right
                self._groups[storage].append(right)
                return

    def _forget_freed(self) -> None:
        """Name the segments of a copied storage that is gone by their copy: its address may be reused.

        All gone ones are taken out before any is put back: one's copy may sit at the address of
        another gone one (freed, then given to the copy), whose name it would take while still in use.
        """
        gone = [storage for storage, source in self._sources.items() if source.expired()]
        moved = []
        for storage in gone:
            del self._sources[storage]
            for segment in self._groups.pop(storage):
                del self.segments[storage, segment.start]
                moved.append(segment)
        for segment in moved:  # a copy's address is a live allocation's: no other storage's name
            segment.storage, segment.start, _ = _span((segment.state, segment.length))
            segment.copied = False
            self.segments[segment.storage, segment.start] = segment
            self._groups.setdefault(segment.storage, []).append(segment)

    def _settle(self) -> None:
        """Fit each storage's segments to the positions the rows read of it, then join neighbours."""
        groups: dict[Storage, list[_Segment]] = {}
        for segment in self.segments.values():
            groups.setdefault(segment.storage, []).append(segment)
        for storage, group in groups.items():
            self._fit(storage, group)
        self._sources = {
            storage: source
            for storage, source in self._sources.items()
            if storage in groups and all(s.copied for s in groups[storage])
        }
        self._coalesce()

    def _fit(self, storage: Storage, group: list[_Segment]) -> None:
        """Put one storage's segments on one memory: the storage, or a copy of the positions read.

        The storage while the rows read at least half of it; otherwise a fresh copy of the range
        they read, so the batch never keeps alive more than twice what it reads. All the segments
        move together, so neighbours stay joinable and rows that share positions share the copy.
        """
        lo, hi = min(s.start for s in group), max(s.start + s.length for s in group)
        source = next((s for s in group if not s.copied), group[0])  # the storage holds every position
        t = source.state[0]
        held = t.untyped_storage().nbytes()
        read = (hi - lo) * t.numel() // t.shape[-2] * t.element_size()
        if 2 * read >= held:
            if not source.copied:  # back onto the storage a new row holds anyway: the copy can go
                for segment in group:
                    if segment.copied:
                        segment.state = _moved(source.state, segment.start - source.start, segment.length)
                        segment.copied = False
            return
        if not source.copied:
            self._sources[storage] = StorageWeakRef(t.untyped_storage())
        hull = _moved(source.state, lo - source.start, hi - lo)
        fresh = tuple(x.clone(memory_format=torch.contiguous_format) for x in hull)
        for segment in group:
            segment.state, segment.copied = _moved(fresh, segment.start - lo, segment.length), True

    def _coalesce(self) -> None:
        """Join neighbouring segments of one storage that the same rows read (one attention call, not two).

        Sound after ``_fit``: a storage's segments are all views of one memory.
        """
        joined: dict[tuple[Storage, int], _Segment] = {}
        groups: dict[Storage, list[_Segment]] = {}
        grown: dict[_Segment, None] = {}
        last: _Segment | None = None
        for segment in sorted(self.segments.values(), key=lambda s: (s.storage, s.start)):
            if (
                last is not None
                and last.storage == segment.storage
                and last.start + last.length == segment.start
                and sorted(last.rows) == sorted(segment.rows)
            ):
                last.length += segment.length
                grown[last] = None
                continue
            joined[segment.storage, segment.start] = last = segment
            groups.setdefault(segment.storage, []).append(segment)
        for segment in grown:  # new views once per joined run, not once per join
            segment.state = _moved(segment.state, 0, segment.length)
        self.segments, self._groups = joined, groups

    def _write_row(self, row: int, state: tuple[torch.Tensor, ...], n: int) -> None:
        at = self.lengths[row]
        for layer in range(self.num_layers):
            self.keys[layer, row, :, at : at + n] = state[2 * layer][0, :, :n]
            self.values[layer, row, :, at : at + n] = state[2 * layer + 1][0, :, :n]
        self.lengths[row] = at + n

    def _reserve(self, need: int) -> None:
        """Room for every row and ``need`` positions in each (regrown with slack when short)."""
        rows, have_rows, have = len(self.lengths), self.keys.shape[1], self.keys.shape[3]
        need = max(need, max(self.lengths, default=0))
        if rows <= have_rows and need <= have:
            return
        # Rows joining alone leave the positions as they are.
        capacity = have if need <= have else need + max(_GROWTH, need // 2)
        shape = (self.num_layers, max(rows, have_rows), self.kv_heads, capacity, self.head_dim)
        # Zeros, not empty: masked positions get weight 0 in attention, and 0 * NaN garbage is NaN.
        keys, values = torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype)
        keys[:, :have_rows, :, :have] = self.keys
        values[:, :have_rows, :, :have] = self.values
        self.keys, self.values = keys, values

    def remove(self, rows: Sequence[int]) -> list[int]:
        """Drop ``rows``; return, for each remaining row in its new order, its former index."""
        order = list(range(len(self.lengths)))
        for row in sorted(rows, reverse=True):
            last = len(order) - 1
            for segment in self.segments.values():
                if row in segment.rows:
                    segment.rows.remove(row)
            if row != last:
                # Move the last row into the hole: only its private positions are copied.
                n = self.lengths[last]
                self.keys[:, row, :, :n] = self.keys[:, last, :, :n]
                self.values[:, row, :, :n] = self.values[:, last, :, :n]
                self.offsets[row], self.lengths[row] = self.offsets[last], n
                order[row] = order[last]
                for segment in self.segments.values():
                    segment.rows = [row if r == last else r for r in segment.rows]
            del self.offsets[last], self.lengths[last], order[last]
        self.segments = {k: s for k, s in self.segments.items() if s.rows}
        # A branch gone: the rows left may read its boundary's two sides as one, or too little of a
        # storage to keep it whole.
        self._settle()
        self._plan = None
        longest, rows = max(self.lengths, default=0), len(self.lengths)
        if self.keys.shape[3] > 2 * (longest + _GROWTH) or self.keys.shape[1] > 2 * rows + 8:
            # The longest row left, the rows left: give back the capacity only the rows gone needed.
            self.keys = self.keys[:, : 2 * rows + 8, :, : longest + _GROWTH].clone()
            self.values = self.values[:, : 2 * rows + 8, :, : longest + _GROWTH].clone()
        return order

    def row_state(self, row: int) -> tuple[int, tuple[torch.Tensor, ...]]:
        """``(first position, state)`` of a row's private positions (views, ``[1, Hkv, n, D]``)."""
        n = self.lengths[row]
        state = []
        for layer in range(self.num_layers):
            state.append(self.keys[layer, row : row + 1, :, :n])
            state.append(self.values[layer, row : row + 1, :, :n])
        return self.offsets[row], tuple(state)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write the decoded position's ``k, v`` (``[rows, Hkv, 1, D]``) and attend ``q`` over each row."""
        if layer == 0:
            self._begin_step()
        rows, at = self._write_at
        self.keys[layer, rows, :, at] = k[:, :, 0]
        self.values[layer, rows, :, at] = v[:, :, 0]
        count, width = len(self.lengths), self._mask.shape[-1]
        private = (self.keys[layer, :count, :, :width], self.values[layer, :count, :, :width], self._mask)
        shared = [(ks[layer], vs[layer], members) for ks, vs, members in self._plan]
        return decode_attention(q, private, shared)

    def _begin_step(self) -> None:
        self._reserve(max(self.lengths) + 1)
        rows = len(self.lengths)
        if self._plan is None:
            self._plan = []
            for segment in self.segments.values():
                members = None if len(segment.rows) == rows else torch.tensor(sorted(segment.rows))
                n, state = segment.length, segment.state
                keys = [state[2 * i][..., :n, :] for i in range(self.num_layers)]
                values = [state[2 * i + 1][..., :n, :] for i in range(self.num_layers)]
                self._plan.append((keys, values, members))
        at = torch.tensor(self.lengths)
        self._write_at = (torch.arange(rows), at)
        seen = at + 1
        width = int(seen.max())
        visible = torch.arange(width)[None, :] < seen[:, None]
        mask = torch.zeros(rows, 1, 1, width, dtype=self.dtype)
        self._mask = mask.masked_fill(~visible[:, None, None, :], float("-inf"))

    def advance(self) -> None:
        """Count the position written by the step that just ran."""
        self.lengths = [n + 1 for n in self.lengths]
