"""A chat model for OpenAI-compatible servers (vLLM, SGLang) that continue an assistant message.

The guided driver prefills the start of the model's turn (``<think>``, a tool-call opening) and
lets the model continue it. vLLM and SGLang do that for a conversation that ends with an
assistant message when the request says ``continue_final_message: true, add_generation_prompt:
false``; :class:`ServerChatModel` sends exactly that, in ``extra_body`` (the openai client
rejects unknown top-level keys), and declares ``supports_prefill`` so the ``auto`` driver guides
it. :func:`check_server` probes a server for what the library needs and names what to change.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import importlib
import json
import math
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

import openai
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.ai import UsageMetadata, subtract_usage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_openai import ChatOpenAI

# The TCP keepalive options ChatOpenAI gives the clients it builds (a silent server is noticed within
# about two minutes, not at the 600 s timeout): its own function, private (langchain-openai <2 is
# required), so LANGCHAIN_OPENAI_TCP_KEEPALIVE=0 turns them off, LANGCHAIN_OPENAI_TCP_KEEPIDLE and
# the others tune them, and an option the kernel refuses is left out (set, it failed every connection).
from langchain_openai.chat_models._client_utils import _default_socket_options
from pydantic import Field, SecretStr

from langgraph_parallelmuse.errors import ConfigError, ProtocolError
from langgraph_parallelmuse.logprobs import SPLIT_CHAR, piece_bytes
from langgraph_parallelmuse.loopback import is_http_url, is_loopback, open_url, shown_url
from langgraph_parallelmuse.models.routing import routing_key
from langgraph_parallelmuse.protocol import one_line
from langgraph_parallelmuse.redact import fits_a_header, redact, secrets_of
from langgraph_parallelmuse.retry import current_attempt

__all__ = [
    "CONTINUE_FINAL_MESSAGE",
    "DEFAULT_TIMEOUT",
    "IncompleteReplyError",
    "ServerChatModel",
    "ServerCheckError",
    "ServerSupport",
    "check_server",
    "served_models",
]

CONTINUE_FINAL_MESSAGE = {"continue_final_message": True, "add_generation_prompt": False}

#: Seconds a request may take before it fails and is retried, unless ``timeout=`` says otherwise.
DEFAULT_TIMEOUT = 600.0


class ServerCheckError(ConfigError):
    """A server lacks something the library needs; the message names the URL, model and fix.

    The message is redacted when the error is made: raised inside a run, it is stored in the
    checkpoints as it is (a URL's password, an echoed key).
    """

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


class IncompleteReplyError(ProtocolError, ConnectionError):
    """A server broke off a reply: a ``finish_reason`` of ``"abort"`` or ``"error"``, an error sent inside
    a streamed reply, or a stream that ended without any ``finish_reason`` (the connection closed
    mid-reply). The message names the server and the model.

    A :class:`ConnectionError`, so :func:`~langgraph_parallelmuse.retry.with_retries` asks again, and a
    :class:`ProtocolError`, so one that outlasts the retries fails only its trajectory: the partial
    text is no reply, and read as one it was taken for the model's whole turn.
    """


# The finish reasons of a reply the server gave up on: vLLM's aborted request ("abort", SGLang's
# too) and its retryable internal error ("error").
_BROKEN_OFF = frozenset({"abort", "error"})


class ServerChatModel(ChatOpenAI):
    """``ChatOpenAI`` for a vLLM/SGLang server: continues a trailing assistant message, routes by key.

    Per request it (1) adds :data:`CONTINUE_FINAL_MESSAGE` to ``extra_body`` when the last message is
    an assistant message, (2) sends the token bound as ``max_tokens``, the field every
    OpenAI-compatible server honours (``ChatOpenAI`` renames it to ``max_completion_tokens``, which
    llama.cpp's servers ignore), and (3) with ``routing_header`` set, sends a digest of the active
    :func:`~langgraph_parallelmuse.models.routing.routing_scope` key (else of the question) in that
    header, so a router keeps every call of one question on one replica and its prefix cache (a
    retry of a failed call, :func:`~langgraph_parallelmuse.retry.with_retries`, sends another key:
    see :func:`route_id`), and
    (4) scores ``continuation="text"`` (the guided driver's :class:`~.segments.Choose`) from vLLM's
    ``prompt_logprobs``: the conversation with ``text`` as a closed assistant reply, one token
    generated; the reply is ``text`` with its prompt logprobs and ``end_logprob``, the logprob of
    the template's end-of-turn token after it, as :class:`~.local.LocalChatModel` returns them;
    a scoring call is never streamed, not even under LangGraph's ``stream_mode="messages"``. A reply
    the server broke off (:class:`IncompleteReplyError`) is an error, never a turn. Its async calls
    keep a connection pool per event loop, so one instance serves the sync API and threads that each
    ``asyncio.run`` a graph at once (unless ``http_async_client``, ``openai_proxy`` or
    ``http_socket_options`` is given: that HTTP layer is used as given).

    Args:
        supports_prefill: Declares the continuation to the driver (``auto`` then guides); set
            ``False`` for a server that cannot continue (check with :func:`check_server`).
        supports_scoring: Declares the scoring to the driver (vLLM; set ``False`` for a server
            without ``prompt_logprobs``: the guided driver then lets the model write its answer).
        routing_header: The router's header (``Server.routing_header``: ``x-smg-routing-key`` for
            sglang-router ``--policy manual``, ``x-session-id`` for vllm-router
            ``--policy consistent_hash``), or ``None`` for one server; the library's own retries
            (3 tries) then each go under another key.
        **kwargs: ``ChatOpenAI`` fields (``base_url``, ``model``, ``logprobs``, ``top_logprobs``, ...);
            ``max_retries`` defaults to 0 (the library retries transient failures itself);
            ``api_key`` defaults to ``OPENAI_API_KEY`` or a placeholder (local servers need none);
            ``timeout`` to :data:`DEFAULT_TIMEOUT` (600 s; ``ChatOpenAI``'s own is none at all);
            ``stream_usage`` to ``True`` (a streamed call asks for its token usage, which
            ``ChatOpenAI`` does only for OpenAI's own URL; pass ``False`` for a server that refuses
            ``stream_options``).

    Raises:
        ConfigError: ``base_url`` is no ``http(s)://`` URL, or the API key holds a character an HTTP
            header cannot carry (a curly quote pasted with it): either failed every call.

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> llm = ServerChatModel(base_url="http://127.0.0.1:8000/v1", model="smollm2", routing_header="x-session-id")
        >>> body = llm._get_request_payload([HumanMessage("Q?"), AIMessage("<think>")], max_tokens=8)
        >>> body["extra_body"], body["max_tokens"], "max_completion_tokens" in body
        ({'continue_final_message': True, 'add_generation_prompt': False}, 8, False)
        >>> list(body["extra_headers"])
        ['x-session-id']
    """

    #: Writes the token bound as ``max_tokens`` in the request body (``Sampling`` leaves it alone).
    sends_max_tokens: ClassVar[bool] = True
    supports_prefill: bool = Field(default=True, description="The server continues a trailing assistant message.")
    supports_scoring: bool = Field(
        default=True, description="The server returns prompt logprobs (vLLM), so continuation= can be scored."
    )
    routing_header: str | None = Field(default=None, description="Header carrying the routing key, if routed.")

    def __init__(self, **kwargs: Any) -> None:
        # Either name: a default under the alias beat an openai_api_key= passed in, and the server got "none".
        if "api_key" not in kwargs and "openai_api_key" not in kwargs:
            kwargs["api_key"] = os.environ.get("OPENAI_API_KEY") or "none"
        if "timeout" not in kwargs and "request_timeout" not in kwargs:
            # ChatOpenAI hands the openai client None, which waits forever (the client's own default is
            # 600 s): a server that hangs would stall its trajectory for good, never failing it.
            kwargs["timeout"] = DEFAULT_TIMEOUT
        # The library retries transient failures itself, with backoff and, routed, under another key
        # (route_id): the openai client's own retries inside those sent a hung request 9 times, 600 s
        # each, and resent a routed one to the replica that had failed.
        kwargs.setdefault("max_retries", 0)
        # ChatOpenAI asks a stream for its token usage (stream_options.include_usage) only on OpenAI's
        # own URL: streamed (any astream(stream_mode="messages") of a graph), every call to vLLM or
        # SGLang then reported 0 prompt tokens, and max_context_tokens never forced an answer.
        kwargs.setdefault("stream_usage", True)
        kwargs.update(_own_clients(kwargs))
        super().__init__(**kwargs)
        key = self.openai_api_key.get_secret_value() if isinstance(self.openai_api_key, SecretStr) else None
        # Without a base URL the openai client reads OPENAI_BASE_URL: one without its scheme failed alike.
        base = self.openai_api_base or os.environ.get("OPENAI_BASE_URL") or None
        _check_endpoint("ServerChatModel", base, key)  # a callable key is read per call

    @property
    def _llm_type(self) -> str:
        return "parallelmuse-openai-server"

    def _get_request_payload(self, input_: Any, *, stop: list[str] | None = None, **kwargs: Any) -> dict:
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        if "max_completion_tokens" in payload:
            payload["max_tokens"] = payload.pop("max_completion_tokens")
        sent = payload.get("messages") or []
        if self.supports_prefill and sent and sent[-1].get("role") == "assistant":
            # Flags the call sets itself win (a scoring call closes the reply instead of continuing it).
            payload["extra_body"] = {**CONTINUE_FINAL_MESSAGE, **(payload.get("extra_body") or {})}
        if self.routing_header:
            key = routing_key(self._convert_input(input_).to_messages())
            headers = payload.get("extra_headers") or {}
            payload["extra_headers"] = {**headers, self.routing_header: route_id(key, attempt=current_attempt())}
        return payload

    # ------------------------------------------------------------------ streaming

    def _should_stream(self, *, async_api: bool, run_manager: Any = None, **kwargs: Any) -> bool:
        # langchain-core streams every call made under a streaming handler (LangGraph's
        # stream_mode="messages"), through ChatOpenAI's _astream, which knows no continuation= and
        # hands it to the openai client (a TypeError). A scoring call generates one token: nothing to
        # stream, so it always goes through _agenerate.
        return "continuation" not in kwargs and super()._should_stream(
            async_api=async_api, run_manager=run_manager, **kwargs
        )

    def _should_use_protocol_streaming(self, *, async_api: bool, run_manager: Any = None, **kwargs: Any) -> bool:
        # The same for langchain-core's v2 event streaming (astream_events(version="v3")), which also
        # drives _astream.
        return "continuation" not in kwargs and super()._should_use_protocol_streaming(
            async_api=async_api, run_manager=run_manager, **kwargs
        )

    # ------------------------------------------------------------------ scoring (Choose)

    @property
    def _where(self) -> str:
        """The server and model an error about a reply names (a URL's password removed)."""
        return redact(f"{self.openai_api_base} (model {self.model_name!r})")

    def _create_chat_result(self, response: Any, generation_info: dict | None = None) -> ChatResult:
        raw = response.model_dump(warnings=False) if hasattr(response, "model_dump") else response
        # A reply without a usable choice (``choices: []``, a null message) failed deep inside
        # ChatOpenAI or langchain-core with a bare IndexError or AttributeError naming no server. A
        # reply carrying an ``error`` is left to ChatOpenAI, which raises that error.
        if isinstance(raw, dict) and not raw.get("error") and (problem := _choices_problem(raw)):
            raise _malformed(self._where, problem)
        if isinstance(raw, dict):
            self._check_finish(raw["choices"] if isinstance(raw.get("choices"), list) else [])
        result = super()._create_chat_result(response, generation_info)
        if isinstance(raw, dict) and raw.get("prompt_logprobs") is not None:  # vLLM's, unread by ChatOpenAI
            result.generations[0].message.response_metadata["prompt_logprobs"] = raw["prompt_logprobs"]
        return result

    def _convert_chunk_to_generation_chunk(
        self, chunk: dict, default_chunk_class: type, base_generation_info: dict | None
    ) -> Any:
        # A streamed reply's logprobs are checked as a whole reply's are: unchecked, a null logprob was
        # found only by whoever read the merged message, in an error naming no server.
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        for i, choice in enumerate(choices if isinstance(choices, list) else []):
            logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
            if problem := _token_logprobs_problem(f"choices[{i}].logprobs", logprobs):
                raise _malformed(self._where, f"a streamed chunk's {problem}")
        self._check_finish(choices if isinstance(choices, list) else [])
        if isinstance(choices, list) and any(_bare_finish(choice) for choice in choices):
            # ChatOpenAI drops a chunk whose delta is null or missing: a server that sends its finish
            # reason on one such ended its reply, unseen, and the whole reply read as cut off.
            choices = [{**c, "delta": {}} if _bare_finish(c) else c for c in choices]
            chunk = {**chunk, "choices": choices}
        return super()._convert_chunk_to_generation_chunk(chunk, default_chunk_class, base_generation_info)

    def _check_finish(self, choices: list) -> None:
        """Raise :class:`IncompleteReplyError` for a choice the server broke off (``_BROKEN_OFF``)."""
        for choice in choices:
            reason = choice.get("finish_reason") if isinstance(choice, dict) else None
            if isinstance(reason, str) and reason in _BROKEN_OFF:
                raise IncompleteReplyError(
                    f"{self._where} broke off its reply (finish_reason {reason!r}): the partial reply is not "
                    "used; the server's log says why"
                )

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        # The Responses API's events carry no finish_reason: only a chat completion's stream is checked.
        ended = self._use_responses_api({**kwargs, **self.model_kwargs})
        counted = None
        try:
            for chunk in super()._stream(*args, **kwargs):
                ended = ended or _finishes(chunk)
                counted = _count_once(chunk, counted)
                yield chunk
        except openai.APIError as exc:
            _raise_mid_stream(exc, self._where)
        if not ended:
            raise _cut_off(self._where)

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        ended = self._use_responses_api({**kwargs, **self.model_kwargs})
        counted = None
        try:
            async for chunk in super()._astream(*args, **kwargs):
                ended = ended or _finishes(chunk)
                counted = _count_once(chunk, counted)
                yield chunk
        except openai.APIError as exc:
            _raise_mid_stream(exc, self._where)
        if not ended:
            raise _cut_off(self._where)

    def _scoring_call(self, messages: list[BaseMessage], continuation: str, top: int) -> tuple[list[BaseMessage], dict]:
        """The request that scores ``continuation``: the reply closed by the chat template itself
        (``continue_final_message`` off), so the template's own end-of-turn token is scored after it."""
        extra = {**(self.extra_body or {}), "prompt_logprobs": top}
        extra.update(continue_final_message=False, add_generation_prompt=False)
        kwargs = {"max_tokens": 1, "temperature": 0.0, "logprobs": False, "top_logprobs": None, "extra_body": extra}
        return [*messages, AIMessage(continuation)], kwargs

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs):
        if (continuation := kwargs.pop("continuation", None)) is None:
            return super()._generate(messages, stop, run_manager, **kwargs)
        top = kwargs.get("top_logprobs", self.top_logprobs) or 0
        sent, call = self._scoring_call(messages, continuation, top)
        return _scored(super()._generate(sent, None, run_manager, **call), continuation, top, self._where)

    async def _agenerate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        if (continuation := kwargs.pop("continuation", None)) is None:
            return await super()._agenerate(messages, stop, run_manager, **kwargs)
        top = kwargs.get("top_logprobs", self.top_logprobs) or 0
        sent, call = self._scoring_call(messages, continuation, top)
        return _scored(await super()._agenerate(sent, None, run_manager, **call), continuation, top, self._where)


def _bare_finish(choice: Any) -> bool:
    """Whether a streamed choice carries a finish reason but no delta (null or missing)."""
    return isinstance(choice, dict) and bool(choice.get("finish_reason")) and choice.get("delta") is None


def _finishes(chunk: ChatGenerationChunk) -> bool:
    """Whether a streamed chunk closes its choice (every OpenAI-compatible server sends a finish_reason last)."""
    return bool((chunk.generation_info or {}).get("finish_reason"))


def _count_once(chunk: ChatGenerationChunk, counted: UsageMetadata | None) -> UsageMetadata | None:
    """Leave ``chunk`` the usage it adds to the ``counted`` so far; return the new total.

    Usage a server streams is the request's total so far: sent once, at the end (OpenAI), it is
    kept; sent on every chunk (``stream_options.continuous_usage_stats`` of vLLM and SGLang),
    LangChain summed the totals when it merged the chunks: a 2,000-token prompt counted 2,000 per
    chunk, and a step's context passed ``max_context_tokens`` on its first reply.
    """
    usage = getattr(chunk.message, "usage_metadata", None)
    if not usage:
        return counted
    if counted:
        chunk.message.usage_metadata = subtract_usage(usage, counted)
    return usage


def _cut_off(where: str) -> IncompleteReplyError:
    """The error of a stream that ended before its reply did: a server that closes the connection
    mid-reply (no chunked encoding to tell a cut body from a whole one) or ends it with an SSE
    ``event: error``, which the openai client skips, left a partial reply that read as a whole turn."""
    return IncompleteReplyError(
        f"{where} ended its streamed reply without a finish_reason (the connection closed mid-reply, or the "
        "server sent an error event): the partial reply is not used; the server's log says why"
    )


def _raise_mid_stream(exc: openai.APIError, where: str) -> NoReturn:
    """Raise an error a server sent inside its 200 stream (``data: {"error": ...}``, as vLLM and SGLang
    report a failure after the reply began) as :class:`IncompleteReplyError`: the openai client raises
    it as a bare ``APIError`` carrying only the server's message, which no retry asked again. Any other
    error (an HTTP status, a dropped connection: the openai client's subclasses) is raised as it is.
    """
    if type(exc) is not openai.APIError:
        raise exc
    raise IncompleteReplyError(
        f"{where} sent an error in the middle of its streamed reply ({' '.join(exc.message.split())[:300]}): "
        "the partial reply is not used"
    ) from exc


def _check_endpoint(who: str, base_url: str | None, key: str | None) -> None:
    """Raise :class:`ConfigError` for a base URL without ``http(s)://`` or a key no HTTP header can carry.

    Either failed every call later, with an error that named neither: "Connection error." for a
    URL without its scheme, ``UnicodeEncodeError: 'ascii' codec can't encode character`` (or, from
    :func:`check_server`, "answered with something that is not JSON") for a key pasted with curly
    quotes around it. A ``base_url`` of ``None`` is OpenAI's own; ``who`` opens the message.
    """
    problems = []
    # Each named by where the user set it (the command line passes OPENAI_API_KEY's value as api_key=).
    if base_url is not None and not is_http_url(base_url):
        name = next((n for n in ("OPENAI_API_BASE", "OPENAI_BASE_URL") if base_url == os.environ.get(n)), "base_url")
        problems.append(
            f"{name}={redact(shown_url(base_url))!r} must be an http:// or https:// URL (http://127.0.0.1:8000/v1)"
        )
    if key is not None and not fits_a_header(key, blanks_inside=True):
        env_key = os.environ.get("OPENAI_API_KEY", "")
        # The Studio graph passes the variable's value stripped of the line break a file gave it.
        source = "OPENAI_API_KEY" if key in (env_key, env_key.strip()) else "api_key="
        problems.append(
            f"the API key ({source}) holds control characters or characters other than ASCII (curly quotes?), "
            "or ends in a space: copy it again"
        )
    if problems:
        raise ConfigError(f"{who}: " + "; ".join(problems))


def _own_clients(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The HTTP clients ``ServerChatModel`` hands ``ChatOpenAI``, or none where the caller chose the HTTP
    layer (``http_client``, ``http_async_client``, ``openai_proxy`` or ``OPENAI_PROXY``,
    ``http_socket_options``).

    Async calls go through :class:`_LoopClients`, a connection pool per event loop. With
    ``http_proxy`` set and no ``no_proxy``, ``ChatOpenAI``'s own clients (httpx reading the
    environment) sent every call to a local vLLM or llama.cpp server to the proxy, its API key
    included, and failed: for a loopback ``base_url`` both clients ask its host directly (only that
    host is mounted direct: a redirect elsewhere keeps the environment's proxy). Elsewhere the sync
    client stays ``ChatOpenAI``'s, with the TCP keepalive options it gives when no proxy setting is
    in the environment, and none (so the environment's proxy is used) when one is.
    """
    chosen = ("http_client", "http_async_client", "openai_proxy", "http_socket_options")
    if any(kwargs.get(name) is not None for name in chosen) or os.environ.get("OPENAI_PROXY"):
        return {}
    proxies = urllib.request.getproxies()  # what httpx reads
    if not proxies:
        return {"http_async_client": _LoopClients(socket_options=_default_socket_options())}
    # ChatOpenAI's order: the argument (either name), then OPENAI_API_BASE, then the SDK's OPENAI_BASE_URL.
    base = kwargs.get("base_url") or kwargs.get("openai_api_base")
    base = base or os.environ.get("OPENAI_API_BASE") or os.environ.get("OPENAI_BASE_URL")
    try:
        host = urllib.parse.urlsplit(base).hostname if isinstance(base, str) else None
    except ValueError:  # not a URL: ChatOpenAI's clients fail on it as they did
        host = None
    # Any proxy setting (no_proxy alone too): ChatOpenAI's socket options go only into the clients it
    # builds, through a custom transport that bypasses the environment's proxy. Handed an async
    # client, it applied them to its sync one and warned: invoke() of a remote server reachable only
    # through the proxy then failed with "Connection error.", where ainvoke() answered.
    keep_proxy = {"http_socket_options": ()}
    if not any(proxies.get(scheme) for scheme in ("http", "https", "all")) or not is_loopback(host):
        return {"http_async_client": _LoopClients(), **keep_proxy}
    # A mount of None is the client's own transport, which is never proxied.
    direct = {f"all://[{host}]" if ":" in host else f"all://{host}": None}
    return {
        "http_client": openai.DefaultHttpxClient(mounts=direct),
        "http_async_client": _LoopClients(mounts=direct),
        **keep_proxy,
    }


# The httpx library openai's clients are built on (httpx2 from openai 3 on, httpx before): a transport
# handed to one of them must come from it (httpx's own failed every request there).
_HTTPX = importlib.import_module(
    next(c for c in openai.DefaultAsyncHttpxClient.__mro__ if c.__name__ == "AsyncClient").__module__.partition(".")[0]
)


# The event loop's connection pools, per (loop, pool options), shared by every ServerChatModel as
# ChatOpenAI shares its cached client: a pool per model left each dropped model's connections open
# until collected ("ResourceWarning: unclosed transport"), and no call reused another model's.
_POOLS: dict[tuple[asyncio.AbstractEventLoop, Any], Any] = {}
_POOLS_LOCK = threading.Lock()


class _LoopClients(openai.DefaultAsyncHttpxClient):
    """An async HTTP client that sends each request through a client (a connection pool) of the running
    event loop's own, made with the same options and shared by the ``_LoopClients`` that have them.

    An httpx pool belongs to the event loop that opened its connections: one pool shared by several
    loops (threads that each ``asyncio.run`` a graph, beside the sync API's background loop) failed
    calls with ``RuntimeError: Event loop is closed`` or ``... is bound to a different event loop``.

    Example:
        >>> import asyncio
        >>> clients = _LoopClients()
        >>> async def pool():
        ...     return clients._pool()
        >>> asyncio.run(pool()) is asyncio.run(pool())
        False
    """

    def __init__(self, *, socket_options: tuple[tuple[int, int, int], ...] = (), **options: Any) -> None:
        # It only builds the requests: a transport of its own (httpx's default) loaded the system's CA
        # certificates for nothing, every ServerChatModel made.
        super().__init__(transport=_HTTPX.AsyncBaseTransport(), **options)
        self._options = options
        self._socket_options = socket_options
        self._key = (socket_options, tuple(sorted((options.get("mounts") or {}).items())))

    def _pool(self) -> Any:
        loop = asyncio.get_running_loop()
        with _POOLS_LOCK:
            # A closed loop's connections serve no one (a thread's asyncio.run per question): without
            # this, every loop that ever called stayed referenced, with its pool.
            for closed in [key for key in _POOLS if key[0].is_closed()]:
                del _POOLS[closed]
            if (loop, self._key) not in _POOLS:
                custom = {}
                if self._socket_options:  # httpx ignores limits= beside a transport: it takes openai's own
                    limits = openai.DEFAULT_CONNECTION_LIMITS
                    custom["transport"] = _HTTPX.AsyncHTTPTransport(socket_options=self._socket_options, limits=limits)
                _POOLS[loop, self._key] = openai.DefaultAsyncHttpxClient(**self._options, **custom)
            return _POOLS[loop, self._key]

    async def send(self, request: Any, **kwargs: Any) -> Any:
        return await self._pool().send(request, **kwargs)

    async def aclose(self) -> None:
        with _POOLS_LOCK:
            pool = _POOLS.pop((asyncio.get_running_loop(), self._key), None)
        if pool is not None:
            await pool.aclose()
        await super().aclose()


def _scored(result: ChatResult, continuation: str, top: int, where: str) -> ChatResult:
    """The reply of a scoring request: ``continuation`` with its prompt logprobs and the end's.

    vLLM's ``prompt_logprobs`` give, per prompt token, ``{token_id: {logprob, rank, decoded_token}}``:
    the prompt token itself first, then the top alternatives by rank (vLLM's
    ``append_logprobs_for_next_position``). The continuation's tokens are the last run of prompt
    tokens whose text spells it; the next token is the template's end of turn. A chat template that
    trims the reply (Llama 3's ``| trim``) scores the option without its outer whitespace: the reply
    is then that trimmed text, the one the tokens spell. A field missing, null or of another shape
    is a :class:`ProtocolError` naming ``where`` (the server and model) and the field.
    """
    message = result.generations[0].message
    positions = _prompt_positions(message.response_metadata.get("prompt_logprobs"), where)
    if not positions:
        raise ServerCheckError(
            f"{where} returned no prompt_logprobs: scoring a continuation needs vLLM; for another server pass "
            "ServerChatModel(supports_scoring=False) and the guided driver lets the model write its answers"
        )
    pieces = [_piece(f"{field}[{position[0][0]}]", position[0][1], where) for field, position in positions]
    for text in dict.fromkeys((continuation, continuation.strip())):
        if (span := _spelling(pieces, text)) is not None:
            break
    else:  # this option's text, not the server's set-up: it fails only its trajectory
        raise ProtocolError(f"{where}: no run of prompt tokens spells the continuation {continuation!r}")
    start, end = span
    content = [
        {
            "token": piece,
            "logprob": _number(position[0][1], "logprob", f"{field}[{position[0][0]}]", where),
            "bytes": list(raw),
            "top_logprobs": _alternatives(position, top, field, where),
        }
        for piece, raw, (field, position) in zip(
            pieces[start:end],
            piece_bytes(pieces[start:end], text),  # the run spells it: _spelling checked
            positions[start:end],
            strict=True,
        )
    ]
    field, position = positions[end]
    metadata = {
        "finish_reason": "stop",
        "logprobs": {"content": content},
        "end_logprob": _number(position[0][1], "logprob", f"{field}[{position[0][0]}]", where),
    }
    usage = message.usage_metadata
    reply = AIMessage(text, response_metadata=metadata, usage_metadata=usage)
    return ChatResult(generations=[ChatGeneration(message=reply)], llm_output=result.llm_output)


# A prompt position: the field that holds it and its (token id, entry) pairs, the prompt token first.
_Position = tuple[str, list[tuple[str, dict]]]


def _prompt_positions(prompt_logprobs: Any, where: str) -> list[_Position]:
    """vLLM's ``prompt_logprobs``, one position per scored prompt token, each entry checked an object.

    Only the prompt's first tokens may be null (nothing before them scores them): a null later
    would shift every following token onto its neighbour's logprob (a null end of turn scored the
    token after it).

    Example:
        >>> _prompt_positions([None, {"7": {"logprob": -1.0, "rank": 1, "decoded_token": "x"}}], "srv")
        [('prompt_logprobs[1]', [('"7"', {'logprob': -1.0, 'rank': 1, 'decoded_token': 'x'})])]
        >>> _prompt_positions([None, {"7": {"logprob": -1.0}}, None], "srv")
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ProtocolError: srv sent a malformed reply: prompt_logprobs[2] is null, ...
    """
    if not prompt_logprobs:  # none returned (an empty list, or a server that ignores the field)
        return []
    if not isinstance(prompt_logprobs, list):
        raise _malformed(where, f"prompt_logprobs is {_show(prompt_logprobs)}, not a list")
    positions: list[_Position] = []
    for i, entry in enumerate(prompt_logprobs):
        field = f"prompt_logprobs[{i}]"
        if entry is None and not positions:
            continue
        if not isinstance(entry, dict) or not entry:
            raise _malformed(
                where,
                f"{field} is {_show(entry)}, not an object of {{token_id: {{logprob, rank, decoded_token}}}} "
                "(only the first prompt tokens may be null)",
            )
        for token_id, alt in entry.items():
            if not isinstance(alt, dict):
                raise _malformed(where, f"{field}[{_show(token_id)}] is {_show(alt)}, not an object")
        positions.append((field, [(_show(token_id), alt) for token_id, alt in entry.items()]))
    return positions


def _piece(field: str, own: dict, where: str) -> str:
    """A prompt token's text (vLLM's ``decoded_token``; none given reads as no text, as before)."""
    text = own.get("decoded_token")
    if text is not None and not isinstance(text, str):
        raise _malformed(where, f"{field}.decoded_token is {_show(text)}, not a string")
    return text or ""


def _alternatives(position: list[tuple[str, dict]], top: int, field: str, where: str) -> list[dict]:
    """A position's ``top`` best entries by vLLM's ``rank``, as chat logprobs' ``top_logprobs``."""
    ranked = sorted(position, key=lambda pair: _number(pair[1], "rank", f"{field}[{pair[0]}]", where))
    return [
        {
            "token": _piece(f"{field}[{token_id}]", alt, where),
            "logprob": _number(alt, "logprob", f"{field}[{token_id}]", where),
        }
        for token_id, alt in ranked[:top]
    ]


def _number(entry: dict, key: str, field: str, where: str) -> float:
    """``entry[key]`` as a float; missing, null or not a number (NaN included) is a ProtocolError.

    A null logprob must stay an error: read as any number it would score the token as that.
    """
    value = entry.get(key)
    if not _is_number(value):
        got = "missing" if key not in entry else _show(value)
        raise _malformed(where, f"{field}.{key} is {got}, not a number")
    return float(value)


def _is_number(value: Any) -> bool:
    """Whether ``float(value)`` reads ``value`` as a number other than NaN (as the logprobs module reads one)."""
    try:
        return not math.isnan(float(value))
    except (TypeError, ValueError, OverflowError):
        return False


def _choices_problem(raw: dict) -> str | None:
    """What makes a chat completion's ``choices`` unreadable, or ``None``.

    Example:
        >>> _choices_problem({"choices": []}), _choices_problem({"choices": [{"message": None}]})
        ('choices is [], not a list of at least one choice', 'choices[0].message is null, not an object')
    """
    choices = raw.get("choices")
    if not isinstance(choices, list) or not choices:
        got = "missing" if "choices" not in raw else _show(choices)
        return f"choices is {got}, not a list of at least one choice"
    for i, choice in enumerate(choices):
        if not isinstance(choice, dict):
            return f"choices[{i}] is {_show(choice)}, not an object"
        message = choice.get("message")
        if not isinstance(message, dict):
            return f"choices[{i}].message is {_show(message)}, not an object"
        if not isinstance(message.get("content"), str | list | None):
            return f"choices[{i}].message.content is {_show(message['content'])}, not a string or null"
        if problem := _tool_calls_problem(f"choices[{i}].message.tool_calls", message.get("tool_calls")):
            return problem
        if problem := _token_logprobs_problem(f"choices[{i}].logprobs", choice.get("logprobs")):
            return problem
    return None


def _tool_calls_problem(field: str, tool_calls: Any) -> str | None:
    """What in a message's ``tool_calls`` ChatOpenAI cannot read, or ``None``.

    Arguments sent as an object instead of a JSON string, or a call without ``function``, failed
    inside ChatOpenAI with a bare ValidationError or TypeError naming no server; arguments that are a
    string but no JSON are ChatOpenAI's ``invalid_tool_calls``, as before.

    Example:
        >>> _tool_calls_problem("tc", [{"id": "1", "function": {"name": "search", "arguments": {"q": "x"}}}])
        'tc[0].function.arguments is {"q": "x"}, not a JSON string'
        >>> _tool_calls_problem("tc", None), _tool_calls_problem("tc", [{"function": {"name": "f", "arguments": "{"}}])
        (None, None)
    """
    if tool_calls is not None and not isinstance(tool_calls, list):
        return f"{field} is {_show(tool_calls)}, not a list"
    for k, call in enumerate(tool_calls or []):
        if not isinstance(call, dict):
            return f"{field}[{k}] is {_show(call)}, not an object"
        function = call.get("function")
        if not isinstance(function, dict):
            got = "missing" if "function" not in call else _show(function)
            return f"{field}[{k}].function is {got}, not an object"
        if not isinstance(function.get("arguments"), str | None):
            return f"{field}[{k}].function.arguments is {_show(function['arguments'])}, not a JSON string"
    return None


# How vLLM's --return-tokens-as-token-ids writes a logprob's token (its bytes then spell this too).
_TOKEN_ID = re.compile(r"token_id:\d+")


def _token_logprobs_problem(field: str, logprobs: Any) -> str | None:
    """What in a choice's chat ``logprobs`` no reader can take (a null logprob, a ``top_logprobs``
    that is no list), or ``None``: what :func:`~langgraph_parallelmuse.logprobs.normalize_logprobs`
    rejects too, named here with the server (other shapes are left to it), and a token id in place of
    the token's text, which it would read as text.

    Example:
        >>> _token_logprobs_problem("lp", {"content": [{"token": "A", "logprob": None, "top_logprobs": []}]})
        'lp.content[0].logprob is null, not a number'
        >>> _token_logprobs_problem("lp", {"content": [{"token": "A", "logprob": -0.1, "top_logprobs": 3}]})
        'lp.content[0].top_logprobs is 3, not a list'
        >>> _token_logprobs_problem("lp", {"content": [{"token": "token_id:9906", "logprob": -0.1}]})[:50]
        'lp.content[0].token is "token_id:9906", a token id'
    """
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    for j, entry in enumerate(content if isinstance(content, list) else []):
        at = f"{field}.content[{j}]"
        if not isinstance(entry, dict):
            return f"{at} is {_show(entry)}, not an object"
        if isinstance(entry.get("token"), str) and _TOKEN_ID.fullmatch(entry["token"]):
            # Read as text, its length placed every later token: the uncertainty regions fell on wrong tokens.
            return (
                f"{at}.token is {_show(entry['token'])}, a token id, not its text: start vLLM without "
                "--return-tokens-as-token-ids"
            )
        if "logprob" in entry and not _is_number(entry["logprob"]):
            return f"{at}.logprob is {_show(entry['logprob'])}, not a number"
        tops = entry.get("top_logprobs")
        if tops is not None and not isinstance(tops, list | dict):
            return f"{at}.top_logprobs is {_show(tops)}, not a list"
        for k, alt in enumerate(tops if isinstance(tops, list) else []):
            if not isinstance(alt, dict):
                return f"{at}.top_logprobs[{k}] is {_show(alt)}, not an object"
            if "logprob" in alt and not _is_number(alt["logprob"]):
                return f"{at}.top_logprobs[{k}].logprob is {_show(alt['logprob'])}, not a number"
    return None


def _show(value: Any) -> str:
    """``value`` as JSON on one line, cut to 60 characters."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _malformed(where: str, what: str) -> ProtocolError:
    """The error of a reply that cannot be read: one line naming the server, the model and the field."""
    return ProtocolError(f"{where} sent a malformed reply: {what}")


def _spelling(pieces: list[str], text: str) -> tuple[int, int] | None:
    """The last run ``pieces[start:end]`` that spells ``text`` and has a token after it.

    A run never starts or ends inside a character split over tokens (the scored end would be a
    byte of it instead of the end of turn). The template's closing after the reply is a few
    tokens, so only runs near the end are tried.

    Example:
        >>> pieces = ["<|im_start|>", "assistant", "\\n", "D", "\ufffd", "\ufffd", "sseldorf", "<|im_end|>", "\\n"]
        >>> _spelling(pieces, "Düsseldorf")
        (3, 7)
        >>> _spelling(["\\n", *["\ufffd"] * 6, "<|im_end|>"], "東京")
        (1, 7)
    """

    def splits(left: str, right: str) -> bool:
        return left.endswith(SPLIT_CHAR) and right.startswith(SPLIT_CHAR)

    reach = len(text.encode()) + 8  # a token per byte at most
    for start in range(len(pieces) - 2, max(-1, len(pieces) - 2 - reach), -1):
        if start > 0 and splits(pieces[start - 1], pieces[start]):
            continue
        for end in range(start + 1, min(len(pieces), start + reach)):
            if not splits(pieces[end - 1], pieces[end]) and piece_bytes(pieces[start:end], text) is not None:
                return start, end
    return None


def route_id(key: str, *, attempt: int = 0) -> str:
    """The header value for a routing key: a short digest (a question may hold any character).

    A retry (``attempt`` > 0) gets another digest, so the router may send it to another replica.
    vllm-router and sglang-router move a key by themselves from a replica they cannot reach, and
    from one that keeps answering HTTP 5xx (after about ten failed tries), but not from one that
    hangs: its requests time out while its ``/health`` answers, and the same key would reach it on
    every retry (BENCHMARKS section 7, "A failing replica"). Only the retried call loses its
    replica's prefix cache; the question's next call goes home again.

    Example:
        >>> route_id("Which river flows through Vienna?")
        '392c438c54ef8d96'
        >>> route_id("Which river flows through Vienna?", attempt=1) != route_id("Which river flows through Vienna?")
        True
    """
    salted = key if attempt == 0 else f"{key}\x00retry {attempt}"
    return hashlib.sha256(salted.encode()).hexdigest()[:16]


def served_models(base_url: str, *, api_key: str | None = None, timeout: float = 60.0) -> list[str]:
    """The model names an OpenAI-compatible server serves (``GET /models``).

    Raises:
        ConfigError: ``base_url`` is no ``http(s)://`` URL, or ``api_key`` cannot be sent in a header.
        ServerCheckError: The server is unreachable or has no ``/models``.
    """
    _check_endpoint("served_models", base_url, api_key)
    with _redacting(api_key):
        return _Client(base_url.rstrip("/"), "", api_key, timeout).models()


@contextmanager
def _redacting(api_key: str | None) -> Iterator[None]:
    """A key passed in is no secret the environment knows: an error a server echoed it into loses it here."""
    try:
        yield
    except ServerCheckError as exc:
        if api_key and api_key in str(exc):
            raise ServerCheckError(redact(str(exc), [api_key, *secrets_of()])) from None
        raise


@dataclass(frozen=True)
class ServerSupport:
    """What :func:`check_server` found a server can do, as :class:`ServerChatModel`'s flags.

    Attributes:
        prefill: It continues a trailing assistant message (``False`` when not checked).
        scoring: It returns vLLM's ``prompt_logprobs``, so the guided driver can choose answers by
            likelihood; without them it lets the model write its answers.

    Example:
        >>> ServerSupport(prefill=True, scoring=False).model_flags()
        {'supports_prefill': True, 'supports_scoring': False}
    """

    prefill: bool
    scoring: bool

    def model_flags(self) -> dict[str, bool]:
        """The keyword arguments of :class:`ServerChatModel` that declare this support."""
        return {"supports_prefill": self.prefill, "supports_scoring": self.scoring}


def check_server(
    base_url: str,
    model: str,
    *,
    top_logprobs: int = 16,
    logprobs: bool = True,
    prefill: bool = True,
    api_key: str | None = None,
    timeout: float = 60.0,
) -> ServerSupport:
    """Check that an OpenAI-compatible server can run the library; raise naming the fix if not.

    Checks in order: the URL answers ``GET /models``; it serves ``model``; a chat completion
    returns ``top_logprobs`` alternatives per token; and (``prefill``) a trailing assistant
    message is continued, not closed: with :data:`CONTINUE_FINAL_MESSAGE` the prompt of
    ``[user, assistant "A"]`` must be that of ``[user]`` plus the one token ``A`` (a server that
    closes the turn adds its end-of-turn and a new assistant header). Last it probes, without
    failing, whether the server returns ``prompt_logprobs`` (vLLM does; llama.cpp's server
    does not), which scoring a given continuation needs.

    Args:
        base_url: The OpenAI API root, as given to ``ChatOpenAI(base_url=...)`` (``.../v1``).
        model: The model name requests send.
        top_logprobs: Alternatives per token the run will ask for (the library's default: 16).
        logprobs: Check the logprobs (a run with ``mode='none'`` needs none).
        prefill: Also check the continuation the guided driver needs.
        api_key: Sent as a bearer token when given.
        timeout: Seconds per request.

    Returns:
        What the server supports, to pass on as ``ServerChatModel(**support.model_flags())``.

    Raises:
        ConfigError: ``base_url`` is no ``http(s)://`` URL, or ``api_key`` cannot be sent in a header.
        ServerCheckError: The first check that failed, naming the URL, the model and what to change.

    Example:
        >>> from langgraph_parallelmuse.serving import free_port
        >>> check_server(f"http://127.0.0.1:{free_port()}/v1", "smollm2")
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.models.server.ServerCheckError: http://127.0.0.1:.../v1 is unreachable (...
    """
    _check_endpoint("check_server", base_url, api_key)
    with _redacting(api_key):
        return _check(_Client(base_url.rstrip("/"), model, api_key, timeout), model, top_logprobs, logprobs, prefill)


def _check(client: _Client, model: str, top_logprobs: int, logprobs: bool, prefill: bool) -> ServerSupport:
    served = client.models()
    if model not in served:
        raise ServerCheckError(
            f"{client.base} serves no model {model!r}; it serves {served}. Pass model= (--model) one of those, "
            f"or start the server under that name (vLLM and SGLang: --served-model-name {model}; "
            f"llama.cpp: --alias {model})."
        )
    if logprobs:
        _check_logprobs(client, top_logprobs)
    if prefill:
        _check_continuation(client)
    return ServerSupport(prefill=prefill, scoring=_returns_prompt_logprobs(client))


class _Client:
    """Minimal JSON-over-HTTP calls with errors that name the server and model."""

    def __init__(self, base: str, model: str, api_key: str | None, timeout: float) -> None:
        self.base, self.model, self.timeout = base, model, timeout
        self.headers = {"content-type": "application/json"}
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"

    @property
    def _checking(self) -> str:
        return f" while checking model {self.model!r}" if self.model else ""

    def _request(self, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base}{path}", data=data, headers=self.headers)
        try:
            return self._exchange(request)
        except TimeoutError as exc:  # connected and asked: a connect timeout is a URLError, caught below
            raise ServerCheckError(
                f"{self.base}{path} did not answer within {self.timeout:g} s{self._checking}: the server is up but "
                "busy, hung or too slow (still loading the model?); read its log, or pass a longer timeout=."
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if body is not None:  # it answered GET /models, so it broke off while handling this request
                raise ServerCheckError(
                    f"{self.base}{path} dropped the request ({reason}){self._checking}: "
                    "the server may have crashed; read its log."
                ) from exc
            raise ServerCheckError(
                f"{self.base} is unreachable ({reason}){self._checking}: start the server, or fix base_url= "
                "(the OpenAI API root, e.g. http://127.0.0.1:8000/v1; --base-url on the command line)."
            ) from exc
        except http.client.InvalidURL as exc:
            raise ServerCheckError(
                f"{self.base} is not a valid URL ({_without_userinfo(str(exc))}): fix base_url= (the OpenAI API "
                "root, e.g. http://127.0.0.1:8000/v1; --base-url on the command line)."
            ) from exc
        except http.client.HTTPException as exc:  # a reply cut off mid-body, or no HTTP server on the port
            raise ServerCheckError(
                f"{self.base}{path} broke off its reply ({type(exc).__name__}: {str(exc)[:200]}){self._checking}: the "
                "server may have crashed, or the port is not an HTTP server; read its log."
            ) from exc
        except ValueError as exc:
            raise ServerCheckError(f"{self.base}{path} answered with something that is not JSON: {exc}") from exc

    def _exchange(self, request: urllib.request.Request) -> tuple[int, dict]:
        """A request's status and JSON reply; ``TimeoutError`` when its body is not all there within
        ``timeout`` of the request (the connection and the headers are bounded per read only)."""
        deadline = time.monotonic() + self.timeout
        try:
            with open_url(request, timeout=self.timeout) as resp:  # a local server directly, never via http_proxy
                return resp.status, _as_object(json.loads(_read_by(resp, deadline) or b"{}"))
        except urllib.error.HTTPError as exc:
            text = _read_by(exc, deadline).decode(errors="replace")
            try:
                return exc.code, _as_object(json.loads(text))
            except ValueError:  # an error page (a web server's HTML): its words, not its markup
                return exc.code, {"error": {"message": re.sub(r"<[^>]*>", " ", text[:5000])}}

    def models(self) -> list[str]:
        status, body = self._request("/models")
        if status in (401, 403):  # a hosted API (OpenAI) without a valid key: the URL itself is right
            raise ServerCheckError(
                f"{self.base}/models answered HTTP {status} ({_message(body)}){self._checking}: {self._key_advice}"
            )
        if status != 200 or not isinstance(body.get("data"), list):
            raise ServerCheckError(
                f"{self.base}/models answered HTTP {status} ({_message(body)}){self._checking}: is base_url= "
                "the OpenAI API root (e.g. http://127.0.0.1:8000/v1; --base-url on the command line)?"
            )
        if not all(isinstance(m, dict) for m in body["data"]):  # read below: an AttributeError naming no server
            raise ServerCheckError(
                f"{self.base}/models sent a malformed reply{self._checking}: data is {_show(body['data'])}, not a "
                'list of objects ({"id": NAME}); is base_url= an OpenAI-compatible server\'s API root?'
            )
        return [str(m.get("id")) for m in body["data"]]

    def chat(self, messages: list[dict], what: str, fix: str, **fields: Any) -> dict:
        body = {"model": self.model, "messages": messages, "max_tokens": 1, "temperature": 0.0, **fields}
        status, reply = self._request("/chat/completions", body)
        if status != 200 or not reply.get("choices"):
            raise ServerCheckError(self._failed_chat(status, reply, what, fix))
        # The checks read choices[0] and its logprobs: another shape was a bare KeyError or AttributeError.
        if problem := _choices_problem(reply):
            raise ServerCheckError(f"{self.base}/chat/completions sent a malformed reply{self._checking}: {problem}")
        return reply

    @property
    def _key_advice(self) -> str:
        sent = "the key sent was refused" if "authorization" in self.headers else "no key was sent"
        return f"{sent}; set OPENAI_API_KEY (or pass api_key=) to a key this server accepts."

    def _failed_chat(self, status: int, reply: dict, what: str, fix: str) -> str:
        """Why a check's chat completion failed. Only a refusal of the request's fields (HTTP 400 or 422,
        or 200 without choices) calls for ``fix``: any status was taken for one, and a server without
        the endpoint (a static file server: 501) was told to raise vLLM's --max-logprobs."""
        said = _message(reply)
        answered = f"{self.base}/chat/completions answered HTTP {status} ({said}){self._checking}"
        if status in (401, 403):
            return f"{answered}: {self._key_advice}"
        # A 404 of the API's own (OpenAI's "The model ... does not exist") is about the model, not the route.
        if status in (405, 501) or (status == 404 and said.lower().strip(" .") in ("not found", "404 not found")):
            return (
                f"{answered}: is this an OpenAI-compatible server? It lists its models (GET {self.base}/models) but "
                "has no chat completions endpoint; fix base_url= (--base-url) to a server that has (vLLM, SGLang, "
                "llama.cpp's server)."
            )
        if status == 429:
            return f"{answered}: rate-limited or over the account's quota; wait, or check the quota."
        if status >= 500:
            return f"{answered}: the server failed on the request; read its log."
        if status in (200, 400, 422):
            return f"{self.base} refused {what} for model {self.model!r}: HTTP {status}, {said}. {fix}"
        return f"{answered}: check the model name (--model) and base_url= (--base-url)."


def _read_by(reply: Any, deadline: float) -> bytes:
    """A reply's body as the server sends it, ``TimeoutError`` once past ``deadline`` (``time.monotonic``).

    A socket's timeout bounds each read, not the reply: a server that sent a byte a second never
    let one time out, and kept a check waiting for as long as it trickled.

    Raises:
        TimeoutError: The body was still arriving at ``deadline``.
        http.client.IncompleteRead: The connection closed before the ``content-length`` it announced
            (``read1``, unlike ``read``, returns what came).
    """
    parts = []
    while part := reply.read1(65536):
        parts.append(part)
        if time.monotonic() > deadline:
            raise TimeoutError("the reply was still arriving at the deadline")
    if missing := getattr(reply, "length", None):
        raise http.client.IncompleteRead(b"".join(parts), missing)
    return b"".join(parts)


def _without_userinfo(invalid_url: str) -> str:
    """An InvalidURL's text without the URL's password: urllib takes ``user:PASSWORD@host`` for the
    host, and http.client quotes everything after its last ``:`` as a "nonnumeric port". A host or
    port holds no ``@``, so all up to the last one is credentials, however short.

    Example:
        >>> _without_userinfo("nonnumeric port: 'pw1@127.0.0.1'")
        "nonnumeric port: '***@127.0.0.1'"
    """
    return re.sub(r"'.*@", "'***@", invalid_url)


def _as_object(body: object) -> dict:
    """A JSON reply as an object; any other JSON (a list, a string) becomes the error's message."""
    return body if isinstance(body, dict) else {"error": {"message": str(body)[:500]}}


def _message(body: dict) -> str:
    """A reply's error message on one line, cut short: it goes inside a one-line error.

    Example:
        >>> _message({"error": {"message": "Requested sample logprobs of 32,\\n  which is greater"}})
        'Requested sample logprobs of 32, which is greater'
    """
    error = body.get("error")
    text = error.get("message") if isinstance(error, dict) else error or body.get("detail") or body
    return one_line(text, 300)


_PROMPT = [{"role": "user", "content": "Name a city."}]


def _check_logprobs(client: _Client, top_logprobs: int) -> None:
    fix = (
        f"Start vLLM with --max-logprobs {top_logprobs} (or more), or lower top_logprobs= of the run; the "
        "library scores uncertainty from these logprobs. A hosted model that refuses logprobs or max_tokens "
        "(OpenAI's reasoning models: o-series, gpt-5) cannot run it: pick one that returns token logprobs "
        "(e.g. gpt-4.1-mini)."
    )
    reply = client.chat(
        _PROMPT, f"logprobs=true, top_logprobs={top_logprobs}", fix, logprobs=True, top_logprobs=top_logprobs
    )
    logprobs = reply["choices"][0].get("logprobs")  # a dict choice: client.chat checked the shape
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    entries = content if isinstance(content, list) else []  # another shape carries no logprobs to read
    if not entries:
        raise ServerCheckError(
            f"{client.base} returned no logprobs for model {client.model!r} (asked logprobs=true, "
            f"top_logprobs={top_logprobs}): use a server that returns them (vLLM, SGLang; llama-cpp-python "
            "with --logits_all true), or run with mode='none' (plain sampling, no uncertainty)."
        )
    got = len(entries[0].get("top_logprobs") or [])
    if got < top_logprobs:
        raise ServerCheckError(
            f"{client.base} returned {got} top_logprobs per token for model {client.model!r}, "
            f"{top_logprobs} asked. {fix}"
        )


def _returns_prompt_logprobs(client: _Client) -> bool:
    """Whether the server fills vLLM's ``prompt_logprobs``; others ignore the field or refuse it."""
    body = {"model": client.model, "messages": _PROMPT, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}
    status, reply = client._request("/chat/completions", body)
    return status == 200 and bool(reply.get("prompt_logprobs"))


def _check_continuation(client: _Client) -> None:
    fix = (
        "This server cannot continue an assistant message: run with driver='free', or pass "
        "ServerChatModel(supports_prefill=False) (or a plain ChatOpenAI)."
    )
    what = "continue_final_message (continuing a trailing assistant message)"
    opened = client.chat(_PROMPT, "a plain chat completion", fix)
    continued = client.chat([*_PROMPT, {"role": "assistant", "content": "A"}], what, fix, **CONTINUE_FINAL_MESSAGE)
    try:
        grown = continued["usage"]["prompt_tokens"] - opened["usage"]["prompt_tokens"]
    except (KeyError, TypeError) as exc:
        raise ServerCheckError(
            f"{client.base} reports no usage.prompt_tokens for model {client.model!r}, so whether it continues "
            f"an assistant message cannot be checked. Pass check_server(..., prefill=False) if you know it does. {fix}"
        ) from exc
    if grown > 1:  # "A" is one token; closing the turn adds an end-of-turn and a new header
        raise ServerCheckError(
            f"{client.base} closed the trailing assistant message instead of continuing it for model "
            f"{client.model!r} (the prompt grew by {grown} tokens for a 1-token prefill; the guided driver "
            f"needs continue_final_message=true, add_generation_prompt=false, as vLLM and SGLang read it). {fix}"
        )
