"""Model forward passes of Llama-style decoders over prefix-cache segments and a batch's KV.

The runner reads the weights of a transformers ``LlamaForCausalLM`` (or a decoder with the same
layout: Qwen2, Mistral without a sliding window) and runs the layers itself, so attention can read
shared prefix segments once for all rows (:mod:`.attention`) and no KV is copied per step.

Precision: ``"float32"`` computes everything in float32 (the reference). ``"bfloat16"`` runs the
matrix products (projections, MLP, LM head, attention) in bfloat16 with float32 accumulation (AMX /
AVX-512-BF16 on recent x86) and keeps KV in bfloat16; the residual stream, norms, rotary
embedding, softmax and the returned logits stay float32. ``"auto"`` is bfloat16 where the CPU has
native bfloat16 instructions and float32 elsewhere (:mod:`.hardware`).
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.models.attention import prefill_attention
from langgraph_parallelmuse.models.hardware import (
    PRECISIONS,
    Precision,
    blas_for_float32,
    native_bfloat16,
    resolve_precision,
)
from langgraph_parallelmuse.models.kv_batch import BatchKV, Piece

__all__ = ["ModelRunner", "check_transformers"]

_PREFILL_CHUNK = 2048
# Products of at most this many rows go to OpenBLAS where it is the float32 BLAS (see _Linear).
_OPENBLAS_ROWS = 64
_TRANSFORMERS_FLOOR = (5, 24)
_ARCHITECTURES = ("llama", "mistral", "qwen2")

#: ``(state, n)``: the first ``n`` positions of ``state = (k0, v0, k1, v1, ...)``.

#: ``attend(layer, q, k, v) -> out``: q ``[B, H, L, D]``, k/v ``[B, Hkv, L, D]`` of the new positions.
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def check_transformers() -> None:
    """Refuse a transformers release older than the one the loader and tests are written against.

    Raises:
        ConfigError: transformers is older than 5.24; the message names the upgrade.

    Example:
        >>> check_transformers()
    """
    import transformers
    from packaging.version import Version

    installed = Version(transformers.__version__)
    if installed.release < _TRANSFORMERS_FLOOR:
        floor = ".".join(map(str, _TRANSFORMERS_FLOOR))
        raise ConfigError(
            f"transformers {installed} is installed but the engine needs >= {floor} (the model "
            f"layout its forward pass reads): pip install 'transformers>={floor},<6'"
        )


@dataclass(frozen=True)
class _Linear:
    """``y = x W^T + b`` with ``W`` ``[out, in]``; ``columns``, when set, holds ``W^T`` for OpenBLAS.

    On CPUs where MKL's products of few rows are slow (:func:`.hardware.blas_for_float32`), a
    float32 product of at most ``_OPENBLAS_ROWS`` rows (a decode step) goes to numpy's OpenBLAS on
    ``W^T`` stored contiguously, ``[in, out]``, the layout its kernels read fastest, on one thread;
    ``weight`` is then a transposed view of the same memory, which MKL multiplies on torch's
    threads for the long products of a prefill.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    columns: np.ndarray | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if self.columns is not None and rows <= _OPENBLAS_ROWS:
            flat = x.reshape(rows, x.shape[-1]).contiguous().numpy()
            y = torch.from_numpy(np.matmul(flat, self.columns)).view(*x.shape[:-1], self.columns.shape[1])
        else:
            y = F.linear(x.to(self.weight.dtype), self.weight).float()
        return y if self.bias is None else y + self.bias


@dataclass(frozen=True)
class _Layer:
    norm_in: torch.Tensor
    qkv: _Linear
    o: _Linear
    norm_post: torch.Tensor
    gate_up: _Linear
    down: _Linear


def _fused(modules: Sequence[Any], dtype: torch.dtype, *, openblas: bool) -> _Linear:
    """One linear map stacking ``modules``' outputs (one matrix product instead of several).

    In the modules' own dtype no second copy of the weights is kept: the modules are pointed at
    views of the stacked matrix (same values, so the transformers model still computes the same).
    ``openblas`` stores the stacked matrix transposed (see :class:`_Linear`).
    """
    weights = [m.weight.detach() for m in modules]
    weight = (torch.cat(weights) if len(weights) > 1 else weights[0]).to(dtype)
    columns = None
    if openblas:
        transposed = weight.t().contiguous()
        columns, weight = transposed.numpy(), transposed.t()
    else:
        weight = weight.contiguous()
    if weight.dtype == weights[0].dtype:
        rows = 0
        for module, original in zip(modules, weights, strict=True):
            module.weight.data = weight[rows : rows + original.shape[0]]
            rows += original.shape[0]
    bias = None
    if any(m.bias is not None for m in modules):
        zeros = [m.weight.new_zeros(m.weight.shape[0]) for m in modules]
        bias = torch.cat([z if m.bias is None else m.bias.detach() for m, z in zip(modules, zeros, strict=True)])
        bias = bias.float()
    return _Linear(weight, bias, columns)


@dataclass(frozen=True)
class _Weights:
    embed: torch.Tensor
    norm: torch.Tensor
    head: _Linear
    layers: list[_Layer]
    cos: torch.Tensor
    sin: torch.Tensor


# Runners of one model and dtype (engines with different settings) share one set of weights.
_weight_sets: weakref.WeakKeyDictionary[Any, dict[torch.dtype, _Weights]] = weakref.WeakKeyDictionary()
_weight_lock = threading.Lock()


def _weights(model: Any, dtype: torch.dtype) -> _Weights:
    with _weight_lock:
        sets = _weight_sets.setdefault(model, {})
        if dtype not in sets:
            sets[dtype] = _build_weights(model, dtype)
        return sets[dtype]


@functools.cache
def _one_openblas_thread() -> None:
    """Run numpy's OpenBLAS on the calling thread only (process-wide, once).

    Its worker threads and torch's OpenMP threads, each waiting busily for work, took turns on the
    same cores: with two threads each, a decode step took 2-3x as long as with OpenBLAS on one.
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def _build_weights(model: Any, dtype: torch.dtype) -> _Weights:
    inner = model.model
    openblas = dtype == torch.float32 and blas_for_float32() == "openblas"
    if openblas:
        _one_openblas_thread()
    fused = functools.partial(_fused, dtype=dtype, openblas=openblas)
    # The head first: with tied embeddings the embedding below is then a view of its new storage.
    head = fused([model.get_output_embeddings()])
    layers = []
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(
            _Layer(
                norm_in=layer.input_layernorm.weight.detach().float(),
                qkv=fused([attn.q_proj, attn.k_proj, attn.v_proj]),
                o=fused([attn.o_proj]),
                norm_post=layer.post_attention_layernorm.weight.detach().float(),
                gate_up=fused([mlp.gate_proj, mlp.up_proj]),
                down=fused([mlp.down_proj]),
            )
        )
    embed = inner.embed_tokens.weight.detach().float()
    positions = torch.arange(int(getattr(model.config, "max_position_embeddings", 0) or 1 << 15))[None]
    with torch.inference_mode():
        cos, sin = inner.rotary_emb(embed[:1], position_ids=positions)
    return _Weights(embed, inner.norm.weight.detach().float(), head, layers, cos[0].float(), sin[0].float())


def _check_architecture(model: Any) -> None:
    config = model.config
    layer_types = getattr(config, "layer_types", None) or ()
    sliding = any(t != "full_attention" for t in layer_types) or (
        config.model_type == "mistral" and getattr(config, "sliding_window", None)
    )
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    problem = None
    if config.model_type not in _ARCHITECTURES:
        problem = f"model type {config.model_type!r} is not one of {', '.join(_ARCHITECTURES)}"
    elif sliding:
        problem = "sliding-window attention is not supported"
    elif "dynamic" in rope:
        problem = f"rope type {rope!r} (position-dependent scaling) is not supported"
    elif getattr(config, "hidden_act", "silu") != "silu":
        problem = f"activation {config.hidden_act!r} is not supported"
    if problem:
        raise ConfigError(
            f"the in-process engine runs Llama-style decoders; {problem}: use one of those models, or "
            "serve this one with an OpenAI-compatible server and pass a ChatOpenAI model"
        )


class ModelRunner:
    """Forward passes of a Llama-style causal LM: prefill of requests packed together, decode of a batch.

    Args:
        model: A ``transformers`` causal LM of a supported architecture (eval mode).
        precision: ``"float32"``, ``"bfloat16"`` or ``"auto"`` (see the module docstring); a
            requested bfloat16 on a CPU without native bfloat16 instructions runs, with a warning.

    Raises:
        ConfigError: Unsupported architecture or precision, or a too old transformers.

    Example:
        >>> from langgraph_parallelmuse.models.loading import load_model
        >>> runner = ModelRunner(load_model().model)  # doctest: +SKIP
        >>> ((state, logits),) = runner.prefill([([1, 2, 3], ())])  # doctest: +SKIP
        >>> logits.shape[0], state[0].shape[-2]  # doctest: +SKIP
        (1, 3)
    """

    def __init__(self, model: Any, *, precision: Precision = "float32") -> None:
        check_transformers()
        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        _check_architecture(model)
        config = model.config
        if precision == "bfloat16" and not native_bfloat16():
            warnings.warn(
                "precision='bfloat16' on a CPU without native bfloat16 instructions (AVX-512-BF16, AMX): "
                "PyTorch's generic kernels make it many times slower than float32; use precision='auto'",
                RuntimeWarning,
                stacklevel=2,
            )
        self.precision = resolve_precision(precision)
        self.dtype = getattr(torch, self.precision)
        self.num_layers = config.num_hidden_layers
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        weights = _weights(model, self.dtype)
        self.embed, self.norm, self.head, self.layers = weights.embed, weights.norm, weights.head, weights.layers
        self.cos, self.sin = weights.cos, weights.sin

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one position takes (all layers, keys and values)."""
        return 2 * self.num_layers * self.kv_heads * self.head_dim * self.dtype.itemsize

    @property
    def weight_bytes(self) -> int:
        """Bytes of the matrices one forward pass reads (layers and LM head)."""
        mats = [self.head.weight] + [
            m.weight for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)
        ]
        return sum(t.numel() * t.element_size() for t in mats)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, weight.shape, weight, self.eps)

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend, *, keep: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run the layers over ``tokens`` ``[B, L]`` at ``positions`` ``[B, L]``; return float32 logits.

        ``attend`` receives each layer's queries and the new positions' keys and values (rotary
        embedding applied, in the KV dtype) and returns the attention output ``[B, H, L, D]``.
        ``keep`` selects the positions whose logits are computed (``[B, len(keep), vocab]``; all
        by default).
        """
        batch, length = tokens.shape
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        cos, sin = self.cos[positions][:, :, None, :], self.sin[positions][:, :, None, :]  # [B, L, 1, D]
        x = F.embedding(tokens, self.embed)
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms(x, layer.norm_in))
            qk = qkv[..., : (heads + kv_heads) * dim].view(batch, length, heads + kv_heads, dim)
            qk = _rotate(qk, cos, sin).to(self.dtype)
            q, k = qk.transpose(1, 2).split([heads, kv_heads], dim=1)
            v = qkv[..., (heads + kv_heads) * dim :].reshape(batch, length, kv_heads, dim).transpose(1, 2)
            out = attend(index, q, k.contiguous(), v.to(self.dtype).contiguous())
            x = x + layer.o(out.transpose(1, 2).reshape(batch, length, heads * dim))
            gate, up = layer.gate_up(self._rms(x, layer.norm_post)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        if keep is not None:
            x = x[:, keep]
        return self.head(self._rms(x, self.norm))

    def prefill(
        self, requests: Sequence[tuple[Sequence[int], Sequence[Piece]]], *, tails: Sequence[int] | None = None
    ) -> list[tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
        """Compute each request's prompt KV after its cached prefix, packed into shared forward passes.

        The requests' new tokens go through the layers together (one read of the weights for all of
        them, at most 2,048 tokens per pass; a longer prompt is split over passes); only attention
        is per request.

        Args:
            requests: ``(prompt, prefix)`` each: the whole prompt and the ``(state, n)`` pieces of a
                prefix-cache match covering its first positions (``state`` holds ``[k0, v0, ...]``,
                of which the first ``n`` positions count). At least one position must be new.
            tails: Per request, how many of its last positions to return logits after (default 1;
                at most its new positions): a scored continuation gets the logits of all its
                tokens from this one pass instead of one decode step each.

        Returns:
            Per request: the new positions' state ``(k0, v0, k1, v1, ...)`` (each ``[1, Hkv, S, D]``,
            owned by the caller) and the float32 logits after each of its last ``tail`` tokens
            (``[tail, vocab]``).
        """
        tails = list(tails) if tails is not None else [1] * len(requests)
        parts = [
            [
                [(state[2 * i][..., :n, :], state[2 * i + 1][..., :n, :]) for state, n in prefix]
                for i in range(self.num_layers)
            ]
            for _, prefix in requests
        ]
        own: list[list[list[tuple[torch.Tensor, torch.Tensor]]]] = [
            [[] for _ in range(self.num_layers)] for _ in requests
        ]
        logits: list[list[torch.Tensor]] = [[] for _ in requests]
        for passing in _passes([(len(p), sum(n for _, n in pre)) for p, pre in requests]):
            self._prefill_pass([(requests[r][0], r, b, e) for r, b, e in passing], parts, own, logits, tails)
        out = []
        for pieces, rows in zip(own, logits, strict=True):
            state = []
            for layer in pieces:
                keys, values = zip(*layer, strict=True)
                state.extend(
                    (torch.cat(keys, dim=-2), torch.cat(values, dim=-2)) if len(keys) > 1 else (keys[0], values[0])
                )
            out.append((tuple(state), torch.cat(rows)))
        return out

    def _prefill_pass(self, items, parts, own, logits, tails: Sequence[int]) -> None:
        """One forward pass over ``items`` = ``(prompt, request, begin, end)`` token ranges."""
        sizes = [end - begin for _, _, begin, end in items]
        tokens = torch.tensor([[t for prompt, _, begin, end in items for t in prompt[begin:end]]])
        positions = torch.cat([torch.arange(begin, end) for _, _, begin, end in items])[None]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            outs = []
            for (_, r, _, _), qi, ki, vi in zip(
                items, q.split(sizes, 2), k.split(sizes, 2), v.split(sizes, 2), strict=True
            ):
                if len(items) > 1:
                    ki, vi = ki.contiguous(), vi.contiguous()  # each request owns its KV
                outs.append(prefill_attention(qi, ki, vi, parts[r][layer] + own[r][layer]))
                own[r][layer].append((ki, vi))
            return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]

        # Each item's wanted positions: those of its request's tail that fall in this pass (a long
        # prompt is split over passes, and its tail may straddle two).
        wanted, offset = [], 0
        for (prompt, r, begin, end), size in zip(items, sizes, strict=True):
            first = min(max(begin, len(prompt) - tails[r]), end)
            wanted.append((r, offset + first - begin, offset + size))
            offset += size
        keep = torch.cat([torch.arange(lo, hi) for _, lo, hi in wanted])
        out = self.forward(tokens, positions, attend, keep=keep)[0]
        at = 0
        for r, lo, hi in wanted:
            if hi > lo:
                logits[r].append(out[at : at + hi - lo])
                at += hi - lo

    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        """Raw log-probabilities of every next token of ``tokens`` (teacher forcing): ``[len, vocab]``.

        Example:
            >>> from langgraph_parallelmuse.models.loading import load_model
            >>> ModelRunner(load_model().model).score([1, 2, 3]).shape[0]  # doctest: +SKIP
            3
        """
        with torch.inference_mode():
            ((_, logits),) = self.prefill([(tokens, ())], tails=[len(tokens)])
        return torch.log_softmax(logits, dim=-1)

    def decode(self, batch: BatchKV, tokens: Sequence[int]) -> torch.Tensor:
        """One decode step of every row of ``batch`` (fed ``tokens``); returns logits ``[rows, vocab]``."""
        positions = batch.positions()[:, None]
        logits = self.forward(torch.tensor(tokens)[:, None], positions, batch.attend)[:, 0]
        batch.advance()
        return logits


def _passes(spans: Sequence[tuple[int, int]]) -> list[list[tuple[int, int, int]]]:
    """Pack ``(length, start)`` token spans into forward passes of at most ``_PREFILL_CHUNK`` tokens.

    Returns ``(request, begin, end)`` ranges per pass, in request order; a long span is split over
    consecutive passes (its later part attends to the earlier one).

    Example:
        >>> _passes([(3000, 0), (100, 50), (10, 0)])
        [[(0, 0, 2048)], [(0, 2048, 3000), (1, 50, 100), (2, 0, 10)]]
    """
    passes: list[list[tuple[int, int, int]]] = [[]]
    size = 0
    for request, (length, start) in enumerate(spans):
        for begin in range(start, length, _PREFILL_CHUNK):
            end = min(begin + _PREFILL_CHUNK, length)
            if size + end - begin > _PREFILL_CHUNK and passes[-1]:
                passes.append([])
                size = 0
            passes[-1].append((request, begin, end))
            size += end - begin
    return passes


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotary embedding: feature ``i`` of a head turns with feature ``i + dim/2``."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin
