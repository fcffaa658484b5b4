"""A tiny random-weight Llama and BPE tokenizers built in memory (no files, no download).

The real engine code runs on it in milliseconds, so the fast suite exercises the transformers calls
the engine makes (a transformers release that drops or renames one fails here, not only in the
slow suite). The weights are drawn with a large init scale so the next-token distributions are
peaked: greedy choices are then far from ties and stable under float32 reordering.
"""

from __future__ import annotations

from typing import Any

import torch

from langgraph_parallelmuse.models.decoding import byte_decoder

# A few merges, so that many tokens are longer than one byte (stop strings can start inside them).
_MERGES = "Ġ t|h e|Ġt he|i n|e r|Ġ a|o n|a n|r e|Ġ s|e s|Ġ w|a t|Ġ c|o r|e n|i s|Ġ o|Ġ b|Ġ f".split("|")


def tiny_tokenizer(*, extra_merges: tuple[str, ...] = ()) -> Any:
    """A GPT-2-style byte-level BPE tokenizer: 256 byte tokens, 20 merges, ``<|im_end|>`` as EOS.

    ``extra_merges`` (``"left right"`` in the byte-level alphabet) come after those, e.g. ``"Ġ Ã"``
    for a token of a space and the first byte of a two-byte character.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_of = byte_decoder()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_of, key=byte_of.__getitem__))}
    merges = []
    for pair in (*_MERGES, *extra_merges):
        left, right = pair.split(" ")
        merges.append((left, right))
        vocab[left + right] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>")


def tiny_sentencepiece_tokenizer() -> Any:
    """A Llama-2-style tokenizer: ``▁`` for spaces, 256 ``<0xNN>`` byte-fallback pieces, a few merges."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))])}
    for ch in "abcdefghijklmnopqrstuvwxyz▁":
        vocab[ch] = len(vocab)
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "c"), ("a", "t"), ("▁c", "at"), ("▁", "s"), ("▁s", "at")]
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def tiny_llama(tokenizer: Any, *, seed: int = 0) -> Any:
    """A 2-layer ``LlamaForCausalLM`` with grouped-query attention over ``tokenizer``'s vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.5,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


#: A ChatML template for the tiny tokenizers, which have none.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_chat_engine() -> Any:
    """An ``InferenceEngine`` on the tiny Llama whose tokenizer has the :data:`CHATML` template (close it)."""
    from langgraph_parallelmuse.models import InferenceEngine

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHATML
    return InferenceEngine(tiny_llama(tokenizer), tokenizer)
