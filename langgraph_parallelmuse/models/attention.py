"""Attention over KV split into parts: shared prefix segments plus each row's own positions.

A row's keys are the concatenation of several parts: segments of the prefix cache that several rows
share (read once for all of them) and the row's private positions. Attention is computed per part
with its log-sum-exp and the parts are combined exactly: with ``o_i, l_i`` the output and
log-sum-exp of part ``i``, the result is ``sum_i exp(l_i - L) o_i`` with ``L = logaddexp(l_i)``.
Every part goes through torch's CPU flash-attention kernel, which returns the log-sum-exp.

Grouped-query attention is handled by folding the query heads of one KV head into the query axis
(``[B, H, L, D] -> [B, Hkv, g*L, D]``), so K and V are never repeated; the causal self part of a
prefill is the one place where repeating is needed (its queries must stay position-aligned).

Shapes: queries ``[B, H, L, D]``, keys/values ``[B, Hkv, T, D]``, outputs ``[B, H, L, D]`` (float32),
log-sum-exps ``[B, H, L]`` (float32).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["decode_attention", "flash", "prefill_attention"]

_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None = None, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` over one part ``k, v``; returns ``(output, log-sum-exp)``.

    Args:
        q: ``[B, H, L, D]``.
        k: ``[B', Hkv, T, D]`` with ``H`` a multiple of ``Hkv``; ``B'`` is ``B`` or 1 (shared).
        v: Like ``k``.
        mask: Additive ``[B, 1, 1, T]`` mask in ``q``'s dtype (``-inf`` where a key is absent).
        causal: Query ``i`` sees keys ``<= i`` (self-attention of a prefill; needs ``L == T``).

    Example:
        >>> import torch
        >>> q, k = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 5, 8)
        >>> out, lse = flash(q, k, k)
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, k, enable_gqa=True)
        >>> bool(torch.allclose(out, ref, atol=1e-5)), tuple(lse.shape)
        (True, (2, 4, 1))
    """
    batch, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    if causal:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        out, lse = _flash_cpu(q, k, v, 0.0, True)
        return out.float(), lse
    if k.shape[0] == 1 and batch > 1:
        # A part shared by every row: fold the rows into the query axis, read K and V once.
        folded = q.reshape(batch, kv_heads, group * length, dim).permute(1, 0, 2, 3)
        out, lse = _flash_cpu(folded.reshape(1, kv_heads, batch * group * length, dim), k, v, 0.0, False)
        out = out.reshape(kv_heads, batch, group * length, dim).permute(1, 0, 2, 3)
        lse = lse.reshape(kv_heads, batch, group * length).permute(1, 0, 2)
    else:
        out, lse = _flash_cpu(q.reshape(batch, kv_heads, group * length, dim), k, v, 0.0, False, attn_mask=mask)
    return out.reshape(batch, heads, length, dim).float(), lse.reshape(batch, heads, length)


def _combine(
    acc: tuple[torch.Tensor, torch.Tensor], part: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    (o1, l1), (o2, l2) = acc, part
    lse = torch.logaddexp(l1, l2)
    out = o1 * torch.exp(l1 - lse).unsqueeze(-1) + o2 * torch.exp(l2 - lse).unsqueeze(-1)
    return out, lse


def decode_attention(
    q: torch.Tensor,
    private: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    shared: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
) -> torch.Tensor:
    """One query per row over its private positions and the shared segments it reads.

    Args:
        q: ``[B, H, 1, D]``.
        private: ``(k, v, mask)`` of every row's own positions, ``[B, Hkv, T, D]`` and an additive
            ``[B, 1, 1, T]`` mask; each row has at least one (the token being decoded).
        shared: ``(k, v, rows)`` per shared segment, ``[1, Hkv, n, D]`` read by the rows of the
            index tensor ``rows`` (``None``: every row).

    Returns:
        ``[B, H, 1, D]`` in float32.
    """
    k, v, mask = private
    acc = flash(q, k, v, mask=mask)
    for k, v, rows in shared:
        if rows is None:
            acc = _combine(acc, flash(q, k, v))
            continue
        part = flash(q.index_select(0, rows), k, v)
        merged = _combine((acc[0].index_select(0, rows), acc[1].index_select(0, rows)), part)
        acc = (acc[0].index_copy(0, rows, merged[0]), acc[1].index_copy(0, rows, merged[1]))
    return acc[0]


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """A prompt chunk's queries over its cached prefix parts and, causally, over itself.

    Args:
        q: ``[1, H, S, D]`` queries of the chunk's positions.
        k: ``[1, Hkv, S, D]`` keys of the same positions (``v`` likewise).
        v: Values of the chunk.
        prefix: ``(k, v)`` of the positions before the chunk, in any number of parts.

    Returns:
        ``[1, H, S, D]`` in float32.
    """
    acc = flash(q, k, v, causal=True)
    for pk, pv in prefix:
        acc = _combine(acc, flash(q, pk, pv))
    return acc[0]
