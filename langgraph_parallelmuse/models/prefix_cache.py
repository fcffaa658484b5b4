"""A radix tree of token ids that stores the KV states of processed sequences.

Every edge of the tree holds a run of token ids together with the KV slice that the model computed
for exactly those positions, so sequences sharing a prefix share its memory. Splitting an edge
leaves both halves views of the storage it held (no copy), so a batch row still reading the whole
edge and a branch reading its first half read one memory; the bytes are counted per storage, whole
while any edge holds a view of it, and evicting part of one copies the rest out so it can be freed
(once the eviction is over, so a part evicted with it is not copied first). ``match`` walks the
query down the tree and returns views of the slices on the way (no copy: the engine's attention
reads them in place, and stored entries are never written); ``PrefixMatch.concatenated`` copies them
into fresh tensors a caller may extend. Memory is bounded in bytes; least recently used leaves are
evicted first. The tree keeps its set of leaves up to date as it grows and shrinks (as SGLang's
``RadixCache`` does), so an eviction orders only the leaves instead of walking every node.

The tree is framework-agnostic: a "state" is any sequence of tensors whose sequence axis is
``-2`` (the transformers ``[batch=1, heads, seq, head_dim]`` layout), e.g.
``[k0, v0, k1, v1, ...]``.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from langgraph_parallelmuse.models.requests import nonnegative

__all__ = ["PrefixCache", "PrefixMatch"]


@dataclass(eq=False)
class _Store:
    """The memory under the states of one or more nodes: a split leaves both halves views of it.

    Counted whole while any node holds a view of it, so the byte bound covers what is really kept.
    """

    nbytes: int
    nodes: set[_Node] = field(default_factory=set)


@dataclass(eq=False)
class _Node:
    tokens: tuple[int, ...]
    state: tuple[torch.Tensor, ...]
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    last_used: int = 0
    store: _Store | None = None


@dataclass(frozen=True)
class PrefixMatch:
    """The longest cached prefix of a query, as views of the stored tensors.

    Attributes:
        length: How many leading tokens of the query are covered (0 = miss).
        pieces: ``(state, n)`` per tree edge on the path, in order: the edge's stored tensors (one
            per slot) of which the first ``n`` positions belong to the prefix. Read-only.
    """

    length: int
    pieces: tuple[tuple[tuple[torch.Tensor, ...], int], ...]

    def concatenated(self) -> tuple[torch.Tensor, ...]:
        """One new tensor per slot holding the ``length`` positions (a copy)."""
        slots = zip(*(tuple(t[..., :n, :] for t in state) for state, n in self.pieces), strict=True)
        return tuple(torch.cat(slot, dim=-2) for slot in slots)


def _state_bytes(state: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state)


def _owns_storage(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _slice(state: Sequence[torch.Tensor], start: int, stop: int) -> tuple[torch.Tensor, ...]:
    # A copy, so a stored slice never pins the (larger) storage of the tensor it was cut from
    # (a caller's buffer, or a storage the tree no longer needs whole).
    return tuple(t[..., start:stop, :].clone(memory_format=torch.contiguous_format) for t in state)


def _view(state: Sequence[torch.Tensor], start: int, stop: int) -> tuple[torch.Tensor, ...]:
    return tuple(t[..., start:stop, :] for t in state)


class PrefixCache:
    """Radix tree from token-id prefixes to KV states, bounded in bytes with LRU eviction.

    Thread-safe; every method takes an internal lock.

    Args:
        max_bytes: Upper bound on the bytes of stored tensors (a float is rounded down). An
            insertion that would exceed it evicts least recently used leaves first; a single
            sequence larger than the bound is stored only up to what fits.

    Example:
        >>> import torch
        >>> cache = PrefixCache(max_bytes=1 << 20)
        >>> kv = (torch.zeros(1, 1, 4, 2), torch.ones(1, 1, 4, 2))
        >>> cache.insert([1, 2, 3, 4], kv)
        >>> hit = cache.match([1, 2, 9])
        >>> hit.length, tuple(hit.concatenated()[0].shape)
        (2, (1, 1, 2, 2))
    """

    def __init__(self, max_bytes: int) -> None:
        if not nonnegative(max_bytes):
            raise ValueError(f"max_bytes must be a number of bytes >= 0, got {max_bytes!r}")
        # Whole bytes: a float bound (0.5 * 1024**3) made a partial store's slice bounds floats, and
        # the TypeError failed every row of the batch a long request retired from.
        self.max_bytes = int(max_bytes)
        self._root = _Node(tokens=(), state=(), parent=None)
        self._lock = threading.Lock()
        self._clock = itertools.count(1)
        self._bytes = 0
        self._leaves: set[_Node] = set()

    @property
    def nbytes(self) -> int:
        """Bytes currently held by stored tensors."""
        return self._bytes

    @property
    def num_tokens(self) -> int:
        """Number of stored token positions (total length of the tree's edges)."""
        with self._lock:
            return sum(len(n.tokens) for n in self._iter_nodes())

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._root.children.clear()
            self._leaves.clear()
            self._bytes = 0

    def match(self, tokens: Sequence[int], max_length: int | None = None) -> PrefixMatch:
        """The longest cached prefix of ``tokens`` as views of the stored tensors (no copy).

        Args:
            tokens: The query token ids.
            max_length: Cap on the matched length; engines pass ``len(tokens) - 1`` so at least one
                token is left to compute the next-token logits from.

        Returns:
            A :class:`PrefixMatch`; its pieces stay valid after the tree changes (a split or an
            eviction replaces a node's tensors, it never writes into them), so the caller may hold
            them while it computes.
        """
        limit = len(tokens) if max_length is None else min(max_length, len(tokens))
        with self._lock:
            stamp = next(self._clock)
            node, pos, pieces = self._root, 0, []
            while pos < limit:
                child = node.children.get(tokens[pos])
                if child is None:
                    break
                n = 0
                edge = child.tokens
                while n < len(edge) and pos + n < limit and edge[n] == tokens[pos + n]:
                    n += 1
                child.last_used = stamp
                pieces.append((child.state, n))
                pos += n
                if n < len(edge):
                    break
                node = child
            self._touch_ancestors(node, stamp)
            return PrefixMatch(pos, tuple(pieces))

    def insert(
        self, tokens: Sequence[int], state: Sequence[torch.Tensor], *, start: int = 0, adopt: bool = False
    ) -> None:
        """Store the KV state of ``tokens``; only the part not already cached is kept.

        Args:
            tokens: Token ids.
            state: One tensor per slot covering ``tokens[start:]`` on axis ``-2``.
            start: Position of ``state``'s first entry. Positions before it must already be cached
                (they are when ``start`` is the length of a :meth:`match` just made); if they are
                not, nothing is stored.
            adopt: The caller hands ``state`` over: a tensor the tree needs whole is kept as it is
                instead of copied (the caller must not write to it afterwards). Otherwise the tree
                copies the slices it keeps, so the caller may mutate ``state``.
        """
        tokens = tuple(tokens)
        if state and state[0].shape[-2] != len(tokens) - start:
            raise ValueError(f"state covers {state[0].shape[-2]} positions but {len(tokens) - start} tokens were given")
        with self._lock:
            node, pos, stamp = self._descend(tokens)
            if pos == len(tokens) or pos < start:
                return
            per_token = _state_bytes(state) // max(len(tokens) - start, 1)
            needed = per_token * (len(tokens) - pos)
            self._evict(needed, keep=node)
            room = self.max_bytes - self._bytes
            stop = len(tokens) if needed <= room else pos + room // max(per_token, 1)
            if stop <= pos:
                return
            whole = adopt and pos == start and stop == len(tokens) and all(_owns_storage(t) for t in state)
            leaf = _Node(
                tokens=tokens[pos:stop],
                state=tuple(state) if whole else _slice(state, pos - start, stop - start),
                parent=node,
                last_used=stamp,
            )
            self._own(leaf)
            node.children[leaf.tokens[0]] = leaf
            self._leaves.add(leaf)
            self._leaves.discard(node)

    def _descend(self, tokens: tuple[int, ...]) -> tuple[_Node, int, int]:
        """Walk ``tokens`` down the tree, splitting the edge where they diverge; touch the path.

        Returns:
            The deepest node reached, how many tokens it covers, and the access stamp used.
        """
        stamp = next(self._clock)
        node, pos = self._root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            edge = child.tokens
            n = 0
            while n < len(edge) and pos + n < len(tokens) and edge[n] == tokens[pos + n]:
                n += 1
            if n < len(edge):
                child = self._split(child, n)
            child.last_used = stamp
            node, pos = child, pos + n
        self._touch_ancestors(node, stamp)
        return node, pos, stamp

    def _own(self, node: _Node) -> None:
        """Give ``node`` a store of its own: its state is a fresh copy or an adopted whole tensor."""
        node.store = _Store(_state_bytes(node.state), {node})
        self._bytes += node.store.nbytes

    def _split(self, child: _Node, n: int) -> _Node:
        """Cut ``child``'s edge after ``n`` tokens; return the new upper node.

        Both halves become views of the same storage, no copy: a running batch row that reads the
        whole edge and a new one that reads its first ``n`` positions then share that memory (the
        batch groups segments by storage). The bytes do not change.
        """
        assert child.parent is not None and child.store is not None
        upper = _Node(
            tokens=child.tokens[:n],
            state=_view(child.state, 0, n),
            parent=child.parent,
            last_used=child.last_used,
            store=child.store,
        )
        child.store.nodes.add(upper)
        child.parent.children[upper.tokens[0]] = upper
        child.tokens, child.state, child.parent = child.tokens[n:], _view(child.state, n, len(child.tokens)), upper
        upper.children[child.tokens[0]] = child
        return upper

    def _drop(self, loose: Iterable[_Store]) -> None:
        """Free the stores an eviction round took nodes from: whole, or all but what their nodes left need.

        When other nodes still hold views of a store, they are copied out of it (and it goes) so
        that no evicted positions stay pinned and counted: the bound frees what eviction promised.
        """
        # The stores nobody is left in first: freeing them cannot fail, so a failed copy below never
        # leaves a store both gone from the tree and counted.
        for store in sorted(loose, key=lambda s: bool(s.nodes)):
            # Copied before any count changes: a failed copy leaves the store counted, never under-counted.
            copies = [(rest, _slice(rest.state, 0, len(rest.tokens))) for rest in store.nodes]
            self._bytes -= store.nbytes
            for rest, state in copies:
                rest.state = state
                self._own(rest)

    def _touch_ancestors(self, node: _Node, stamp: int) -> None:
        while node is not None and node is not self._root:
            node.last_used = stamp
            node = node.parent

    def _iter_nodes(self):
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _evict(self, needed: int, keep: _Node) -> None:
        """Drop LRU leaves until ``needed`` more bytes fit, sparing ``keep`` and its ancestors."""
        if self._bytes + needed <= self.max_bytes:
            return
        protected = set()
        node = keep
        while node is not None:
            protected.add(id(node))
            node = node.parent
        order = itertools.count()  # ties in last_used: oldest pushed first, never compare nodes
        heap = [(n.last_used, next(order), n) for n in self._leaves if id(n) not in protected]
        heapq.heapify(heap)
        # A victim's store is freed once the round is over, not at once: the nodes left in it would
        # be copied out, and they are often next (the upper half of a split edge becomes a leaf when
        # its lower half goes), so the copies were thrown away. Counted as if freed meanwhile.
        loose: dict[_Store, int] = {}  # store -> bytes freeing it saves, its remaining nodes copied out
        saved = 0
        while heap and self._bytes - saved + needed > self.max_bytes:
            _, _, victim = heapq.heappop(heap)
            parent, store = victim.parent, victim.store
            assert store is not None
            del parent.children[victim.tokens[0]]
            self._leaves.discard(victim)
            store.nodes.discard(victim)
            victim.store = None
            saved -= loose.get(store, 0)
            loose[store] = store.nbytes - sum(_state_bytes(rest.state) for rest in store.nodes)
            saved += loose[store]
            if not parent.children and parent is not self._root:
                self._leaves.add(parent)
                if id(parent) not in protected:
                    heapq.heappush(heap, (parent.last_used, next(order), parent))
        self._drop(loose)
