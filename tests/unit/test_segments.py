"""A turn's segments stitched together: its text, token offsets and usage (hypothesis)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage

from langgraph_parallelmuse.segments import Choose, Gen, Lit, Pick, Sampling, generate_turn
from tests.unit.fakes import ScoringChatModel, tokenize

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PIECES = ["Paris", "e\u0301", "\U0001f600", "\u6771\u4eac", "\u05e9\u05dc\u05d5\u05dd", "\r", "\n", "\u2028", "\u200b"]
PIECES += ["\x00", " ", "<answer>", "</answer>", "\ufb01", "\u0130"]
texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), max_size=8).map("".join)
segment_plans = st.one_of(
    texts.map(lambda text: ("lit", text)),
    st.tuples(texts, st.sampled_from([(), ("</answer>",), ("\n", "\u2028")])).map(lambda gen: ("gen", gen)),
    st.lists(texts.filter(str.strip), min_size=1, max_size=3).map(lambda options: ("choose", options)),
)


@FAST
@given(st.lists(segment_plans, max_size=6), st.floats(0, 2))
def test_a_turn_is_its_pieces_in_order(plan, temperature):
    """A guard (property test): the text is the pieces in order (a ``Lit``'s text, a ``Gen``'s reply cut at its stop, a
    ``Choose``'s chosen option), every token sits at its own text, and each call's usage is counted."""
    script, segments, picks = [], [], []

    def placed(pick: Pick) -> tuple[Pick]:
        picks.append(pick)
        return (pick,)

    for kind, spec in plan:
        if kind == "lit":
            segments.append(Lit(spec))
        elif kind == "gen":
            reply, stop = spec
            script.append(reply)
            segments.append(Gen(stop=stop, name=f"g{len(segments)}"))
        else:
            segments.append(Choose(tuple(spec), [HumanMessage("q")], then=placed))
    model = ScoringChatModel(script=script)
    sampling = Sampling(temperature=temperature)
    turn = asyncio.run(generate_turn(model, [HumanMessage("q")], segments, sampling=sampling, seed=1))

    replies = iter(script)
    expected, gen_tokens = "", 0
    for seg in segments:
        if isinstance(seg, Lit):
            expected += seg.text
        elif isinstance(seg, Gen):
            reply = next(replies)
            cut = min([reply.find(s) for s in seg.stop if s in reply], default=len(reply))
            assert turn.segments[seg.name] == reply[:cut]
            expected += reply[:cut]
            gen_tokens += len(tokenize(reply[:cut]))
        else:
            pick = picks.pop(0)
            assert pick.text == seg.options[pick.index] and abs(sum(pick.shares) - 1) < 1e-9
            expected += pick.text
            gen_tokens += sum(len(tokenize(option)) for option in seg.options)  # scoring is decode work
    assert turn.text == expected
    assert all(turn.text[t["start"] : t["end"]] == t["token"] for t in turn.tokens)
    assert [t["start"] for t in turn.tokens] == sorted(t["start"] for t in turn.tokens)
    assert turn.generated_tokens == gen_tokens
    assert turn.calls == len(script) + len(model.scored)


@pytest.mark.parametrize(("first", "last", "read"), [("length", "stop", "length"), ("stop", "stop", "stop")])
def test_a_streamed_replys_finish_reason_is_read_whichever_chunks_sent_it(first, last, read):
    """A server that sends its finish reason on more than one chunk: LangChain glues them ("lengthstop"),
    and a cut-off reply was taken as a finished one (an answer cut mid-word was the answer)."""
    chunks = [
        AIMessageChunk("Paris is the capit", response_metadata={"finish_reason": first}),
        AIMessageChunk("", response_metadata={"finish_reason": last}),
    ]
    merged = chunks[0] + chunks[1]  # as LangChain merges a streamed reply
    model = GenericFakeChatModel(messages=iter([AIMessage(merged.content, response_metadata=merged.response_metadata)]))
    turn = asyncio.run(generate_turn(model, [HumanMessage("q")], [Gen(name="answer")], sampling=Sampling()))
    assert turn.text == "Paris is the capit" and turn.finish_reason == read


_FIRST_CALL_OF_ANOTHER_MODEL = """
import asyncio, sys
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph_parallelmuse.segments import Gen, Sampling, generate_turn

model = GenericFakeChatModel(messages=iter([AIMessage("hi")]))
asyncio.run(generate_turn(model, [HumanMessage("q")], [Gen(stop=())], sampling=Sampling(logprobs=False), seed=1))
print("langchain_openai" in sys.modules)
"""


def test_a_call_to_another_model_does_not_import_langchain_openai():
    """Importing ``langchain_openai`` takes about 2 s, on the event loop at a first model call: only a
    ``ChatOpenAI`` needs its request adjusted, and none exists before that import (clean interpreter)."""
    run = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL_OF_ANOTHER_MODEL], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False"]
