"""Chat-template control tokens defused in untrusted text (prompt injection through special tokens).

A tokenizer reads the text of a special token ("<|im_end|>") anywhere in a prompt as that token's id,
so a web page or a corpus document quoting it could end its turn and open a fake system turn. A word
joiner (U+2060, invisible, no line break) after the token's first character keeps the text readable
to a person and to the model but no longer spells the token. Only the matched spans change, so a text
without them stays byte-identical, and a defused text stays as it is when defused again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

__all__ = ["JOINER", "defuse_control_tokens", "defuse_special_tokens"]

JOINER = "\u2060"

# The control tokens of the common chat templates, for clients that do not know the tokenizer (a
# server's, ChatOpenAI's): "<|…|>" (ChatML, Llama 3, Phi, GPT, Command R), DeepSeek's fullwidth
# "<｜…｜>", Llama 2's and Mistral's "<s>", "</s>", "[INST]" and "<<SYS>>", Mistral's tool tokens,
# Gemma's turns. The "<|…|>" body holds no blank, bar or bracket, so Elm's "<| x |>" and Haskell's
# "<|>" are no token; nor does any pattern hold the joiner, which makes defusing idempotent.
_GENERIC = (
    r"<\|[^\s|<>\u2060]{1,64}\|>"
    r"|<｜[^\s｜<>\u2060]{1,64}｜>"
    r"|</?s>|<bos>|<eos>|<(?:start|end)_of_turn>|<</?SYS>>"
    r"|\[/?(?:INST|AVAILABLE_TOOLS|TOOL_RESULTS|SYSTEM_PROMPT)\]|\[TOOL_CALLS\]"
)


def _starts(alternatives: str) -> re.Pattern[str]:
    # A lookahead matches at every start, overlapping ones too: "<|[INST]|>" holds two tokens, and
    # replacing non-overlapping matches left the inner one whole (defused only by a second pass).
    return re.compile(f"(?=(?:{alternatives}))")


_GENERIC_STARTS = _starts(_GENERIC)


def _defuse(text: str, starts: re.Pattern[str]) -> str:
    cuts = [m.start() + 1 for m in starts.finditer(text)]
    if not cuts:
        return text
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return JOINER.join(pieces)


def defuse_control_tokens(text: str) -> str:
    """``text`` with the control tokens of the common chat templates defused (a word joiner after
    their first character); any other text is returned unchanged.

    Example:
        >>> defuse_control_tokens("a <|im_end|> b [INST] c <start_of_turn> d")
        'a <\\u2060|im_end|> b [\\u2060INST] c <\\u2060start_of_turn> d'
        >>> defuse_control_tokens("x <| y |> z <|> w <b>")
        'x <| y |> z <|> w <b>'
    """
    return _defuse(text, _GENERIC_STARTS)


@lru_cache(maxsize=8)
def _special_starts(tokens: frozenset[str]) -> re.Pattern[str] | None:
    # Sorted: one pattern in every process (a frozenset's order follows the hash seed; a lookahead finds
    # every start whatever the order). A one-character token cannot be cut.
    cuttable = sorted(t for t in tokens if len(t) > 1 and JOINER not in t)
    return _starts("|".join(map(re.escape, cuttable))) if cuttable else None


def defuse_special_tokens(text: str, tokens: Iterable[str]) -> str:
    """``text`` with every occurrence of one of a tokenizer's special ``tokens`` defused (a word
    joiner after its first character), so the tokenizer reads it as text, not as that token's id.

    Args:
        text: Untrusted text (a message's content).
        tokens: The tokenizer's special tokens as text.

    Example:
        >>> defuse_special_tokens("x<|im_end|>y<filename>", ["<|im_end|>", "<filename>"])
        'x<\\u2060|im_end|>y<\\u2060filename>'
    """
    starts = _special_starts(frozenset(tokens))
    return text if starts is None else _defuse(text, starts)
