"""Model forward passes of Llama-style decoders over prefix-cache segments and a batch's KV.

The runner reads the weights of a transformers ``LlamaForCausalLM`` (or a decoder with the same
layout: Qwen2, Mistral without a sliding window) and runs the layers itself, so attention can read
shared prefix segments once for all rows (:mod:`.attention`) and no KV is copied per step.

Precision: ``"float32"`` computes everything in float32 (the reference). ``"bfloat16"`` runs the
matrix products (projections, MLP, LM head, attention) in bfloat16 with float32 accumulation (AMX /
AVX-512-BF16 on recent x86) and keeps KV in bfloat16; the residual stream, norms, rotary
embedding, softmax and the returned logits stay float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.models.attention import prefill_attention
from langgraph_parallelmuse.models.kv_batch import BatchKV

__all__ = ["PRECISIONS", "ModelRunner", "check_transformers"]

#: Precisions a runner computes in.
PRECISIONS = ("float32", "bfloat16")
Precision = Literal["float32", "bfloat16"]

_PREFILL_CHUNK = 2048
_TRANSFORMERS_FLOOR = (5, 24)
_ARCHITECTURES = ("llama", "mistral", "qwen2")

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
            f"layout and `cache=` keyword it relies on): pip install 'transformers>={floor},<6'"
        )


@dataclass(frozen=True)
class _Linear:
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
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


def _fused(modules: Sequence[Any], dtype: torch.dtype, order: torch.Tensor | None = None) -> _Linear:
    """One linear map stacking ``modules``' outputs (one matrix product instead of several).

    ``order`` permutes the stacked output features (the rotary layout, see :func:`_interleaving`).
    """
    weight = torch.cat([m.weight.detach().float() for m in modules])
    zeros = [m.weight.new_zeros(m.weight.shape[0]) for m in modules]
    bias = None
    if any(m.bias is not None for m in modules):
        bias = torch.cat(
            [z if m.bias is None else m.bias.detach() for m, z in zip(modules, zeros, strict=True)]
        ).float()
    if order is not None:
        weight = weight[order]
        bias = None if bias is None else bias[order]
    return _Linear(weight.to(dtype).contiguous(), bias)


def _interleaving(heads: int, kv_heads: int, dim: int) -> torch.Tensor:
    """Feature order of the fused q/k/v output that puts each rotary pair side by side.

    transformers' rotary embedding pairs feature ``i`` of a head with ``i + dim/2``; stored as
    ``(i, i + dim/2)`` neighbours, the rotation of a head is one complex product. Queries and keys
    are permuted alike, so their dot products (and the attention) are unchanged; values are not.
    """
    half = dim // 2
    pairs = torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).reshape(dim)
    rotated = torch.cat([h * dim + pairs for h in range(heads + kv_heads)])
    return torch.cat([rotated, torch.arange((heads + kv_heads) * dim, (heads + 2 * kv_heads) * dim)])


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
    """Forward passes of a Llama-style causal LM: prefill of one request, decode of a batch.

    Args:
        model: A ``transformers`` causal LM of a supported architecture (eval mode).
        precision: ``"float32"`` or ``"bfloat16"`` (see the module docstring).

    Raises:
        ConfigError: Unsupported architecture or precision, or a too old transformers.

    Example:
        >>> from langgraph_parallelmuse.models.loading import load_model
        >>> runner = ModelRunner(load_model().model)  # doctest: +SKIP
        >>> state, logits = runner.prefill([1, 2, 3], [])  # doctest: +SKIP
        >>> logits.shape[0], state[0].shape[-2]  # doctest: +SKIP
        (1, 3)
    """

    def __init__(self, model: Any, *, precision: Precision = "float32") -> None:
        check_transformers()
        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        _check_architecture(model)
        config = model.config
        self.precision = precision
        self.dtype = getattr(torch, precision)
        self.num_layers = config.num_hidden_layers
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        inner = model.model
        self.embed = inner.embed_tokens.weight.detach().float()
        self.norm = inner.norm.weight.detach().float()
        self.head = _fused([model.get_output_embeddings()], self.dtype)
        order = _interleaving(self.heads, self.kv_heads, self.head_dim)
        self.layers = [self._layer(layer, order) for layer in inner.layers]
        positions = torch.arange(int(getattr(config, "max_position_embeddings", 0) or 1 << 15))[None]
        with torch.inference_mode():
            cos, sin = inner.rotary_emb(self.embed[:1], position_ids=positions)
        half = self.head_dim // 2
        # cos/sin repeat over the two halves of a head: one angle per rotary pair.
        self.rotary = torch.complex(cos[0, :, :half].float(), sin[0, :, :half].float())

    def _layer(self, layer: Any, order: torch.Tensor) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        return _Layer(
            norm_in=layer.input_layernorm.weight.detach().float(),
            qkv=_fused([attn.q_proj, attn.k_proj, attn.v_proj], self.dtype, order),
            o=_fused([attn.o_proj], self.dtype),
            norm_post=layer.post_attention_layernorm.weight.detach().float(),
            gate_up=_fused([mlp.gate_proj, mlp.up_proj], self.dtype),
            down=_fused([mlp.down_proj], self.dtype),
        )

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
        self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend, *, last_only: bool
    ) -> torch.Tensor:
        """Run the layers over ``tokens`` ``[B, L]`` at ``positions`` ``[B, L]``; return float32 logits.

        ``attend`` receives each layer's queries and the new positions' keys and values (rotary
        embedding applied, in the KV dtype) and returns the attention output ``[B, H, L, D]``.
        ``last_only`` keeps the logits of the last position only (``[B, vocab]``).
        """
        batch, length = tokens.shape
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        rotary = self.rotary[positions][:, :, None, :]  # [B, L, 1, dim/2]
        x = F.embedding(tokens, self.embed)
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms(x, layer.norm_in))
            qk = torch.view_as_complex(
                qkv[..., : (heads + kv_heads) * dim].reshape(batch, length, heads + kv_heads, -1, 2)
            )
            qk = torch.view_as_real(qk * rotary).reshape(batch, length, heads + kv_heads, dim).to(self.dtype)
            q, k = qk.transpose(1, 2).split([heads, kv_heads], dim=1)
            v = qkv[..., (heads + kv_heads) * dim :].reshape(batch, length, kv_heads, dim).transpose(1, 2)
            out = attend(index, q, k.contiguous(), v.to(self.dtype).contiguous())
            x = x + layer.o(out.transpose(1, 2).reshape(batch, length, heads * dim))
            gate, up = layer.gate_up(self._rms(x, layer.norm_post)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        if last_only:
            x = x[:, -1]
        return self.head(self._rms(x, self.norm))

    def prefill(
        self, prompt: Sequence[int], prefix: Sequence[tuple[tuple[torch.Tensor, ...], int]], *, every: bool = False
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Compute the KV of the prompt positions after the cached ``prefix``.

        Args:
            prompt: The whole prompt.
            prefix: ``(state, n)`` pieces covering its first positions (a prefix-cache match);
                ``state`` holds ``[k0, v0, k1, v1, ...]`` of which the first ``n`` positions count.
            every: Return the logits after every computed position, not only the last.

        Returns:
            The new positions' state ``(k0, v0, k1, v1, ...)`` (each ``[1, Hkv, S, D]``, owned by
            the caller) and the float32 logits after the last prompt token (``[1, vocab]``), or
            after each computed one (``[S, vocab]``) with ``every``.
        """
        parts = [
            [(state[2 * i][..., :n, :], state[2 * i + 1][..., :n, :]) for state, n in prefix]
            for i in range(self.num_layers)
        ]
        start = sum(n for _, n in prefix)
        chunks: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(self.num_layers)]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = prefill_attention(q, k, v, parts[layer] + chunks[layer])
            chunks[layer].append((k, v))
            return out

        logits = []
        for begin in range(start, len(prompt), _PREFILL_CHUNK):
            ids = list(prompt[begin : begin + _PREFILL_CHUNK])
            positions = torch.arange(begin, begin + len(ids))[None]
            logits.append(self.forward(torch.tensor([ids]), positions, attend, last_only=not every))
        state = []
        for pieces in chunks:
            keys, values = zip(*pieces, strict=True)
            state.extend(
                (torch.cat(keys, dim=-2), torch.cat(values, dim=-2)) if len(keys) > 1 else (keys[0], values[0])
            )
        return tuple(state), torch.cat([x.reshape(-1, x.shape[-1]) for x in logits]) if every else logits[-1]

    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        """Raw log-probabilities of every next token of ``tokens`` (teacher forcing): ``[len, vocab]``.

        Example:
            >>> from langgraph_parallelmuse.models.loading import load_model
            >>> ModelRunner(load_model().model).score([1, 2, 3]).shape[0]  # doctest: +SKIP
            3
        """
        with torch.inference_mode():
            _, logits = self.prefill(tokens, (), every=True)
        return torch.log_softmax(logits, dim=-1)

    def decode(self, batch: BatchKV, tokens: Sequence[int]) -> torch.Tensor:
        """One decode step of every row of ``batch`` (fed ``tokens``); returns logits ``[rows, vocab]``."""
        positions = batch.positions()[:, None]
        logits = self.forward(torch.tensor(tokens)[:, None], positions, batch.attend, last_only=True)
        batch.advance()
        return logits
