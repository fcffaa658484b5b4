"""Online ``search`` and ``visit`` tools backed by the Tavily search and extract APIs.

Same names, arguments and ``(text, {"doc_ids": [...]})`` output as the offline corpus tools, so an
agent can switch between them; here the ids are URLs. A call Tavily failed (a bad key, a spent plan,
a rate limit or timeout that outlasted the retries) also says ``"error": True`` in its artifact, so
the trajectory records the step as a failed tool call, not as what the web said.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import random
import re
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from langchain_core.tools import BaseTool
from tavily import AsyncTavilyClient
from tavily.errors import BadRequestError, ForbiddenError, InvalidAPIKeyError, UsageLimitExceededError
from tavily.errors import TimeoutError as TavilyTimeoutError

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.loopback import is_http_url, is_loopback, shown_url
from langgraph_parallelmuse.redact import fits_a_header, redact, secrets_of
from langgraph_parallelmuse.retry import MAX_RETRY_AFTER, wait_asked
from langgraph_parallelmuse.tools.local_tools import (
    EMPTY_QUERY,
    SEARCH_DESCRIPTION,
    VISIT_DESCRIPTION,
    SearchInput,
    VisitInput,
    artifact_tool,
    echo,
    hit_text,
    no_results,
    pasted_id,
    visit_text,
)

__all__ = ["MissingTavilyKeyError", "make_tavily_tools"]

_MAX_BACKOFF = 30.0
# Tavily's extract endpoint refuses a timeout above 60 s with HTTP 400.
_EXTRACT_MAX_TIMEOUT = 60.0
_URL_RE = re.compile(r"^https?://\S+$", re.IGNORECASE)
_BARE_DOMAIN_RE = re.compile(r"^[\w.-]+\.[a-z]{2,}(/\S*)?$", re.IGNORECASE)
# A value shaped like a word or words ("ollama", "lm-studio", GPT4All's "not needed", "Ollama"): a
# placeholder key, not a secret. A word runs to 12 letters at most: a Hugging Face token's 34 and the
# letters of an OpenAI key without digits are none.
_PLACEHOLDER = re.compile(r"[a-z]{1,12}(?:[ _-][a-z]{1,12})*", re.IGNORECASE)
# A search hit's title is cut to this (or to a quarter of max_chars), so that a page's long title
# leaves its snippet room.
_TITLE_CHARS = 120
# The shortest snippet a shown hit gets: a title and a URL alone say little of what the page holds.
_MIN_SNIPPET = 80
# The statuses of Tavily's refusals, which its client raises as three errors that do not say them
# (ForbiddenError stands for 403, 432 and 433 alike).
_REFUSALS = (BadRequestError, ForbiddenError, InvalidAPIKeyError)
_REFUSAL_MEANINGS = {
    400: "Tavily refused the request as malformed",
    401: "Tavily rejected the API key",
    403: "Tavily refused access",
    432: "Tavily plan limit reached",
    433: "Tavily pay-as-you-go limit reached",
}


class MissingTavilyKeyError(ConfigError):
    """No Tavily API key was given and ``TAVILY_API_KEY`` is not set."""


class _Failed(Exception):
    """A call Tavily failed, described for the agent (before the key is redacted)."""


class _Transient(_Failed):
    """An error worth retrying (rate limit, timeout, 5xx) that outlasted the retries."""


def make_tavily_tools(
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    max_results: int = 5,
    max_chars: int = 4000,
    retries: int = 1,
    timeout: float = 10.0,
    backoff: float = 1.0,
) -> list[BaseTool]:
    """Build web ``search`` and ``visit`` tools on Tavily (``AsyncTavilyClient``).

    Rate limits (HTTP 429), timeouts and 5xx answers are retried with exponential backoff and
    jitter, after at least the wait a ``Retry-After`` header asks (one longer than ``timeout`` is
    told the agent instead); any other failure, or one that outlasts the retries, comes back to the
    agent as an error text (and ``"error": True`` in the artifact, which the trajectory records),
    never as an exception. The API key never appears in any output. A loopback ``base_url`` is
    asked directly, never through the environment's proxy.

    The agent abandons a tool call after the run's ``tool_timeout`` (30 s by default), retries
    included: the defaults (10 s a request, 1 retry) let a timed-out request be retried inside it.
    Raise ``tool_timeout`` with ``timeout`` or ``retries``.

    Args:
        api_key: Tavily API key; defaults to the ``TAVILY_API_KEY`` environment variable.
        base_url: API root (e.g. a proxy or a test server); defaults to ``https://api.tavily.com``.
        max_results: Search hits per query.
        max_chars: Longest output of either tool; long pages become a goal-focused excerpt.
        retries: Extra attempts after the first for retryable errors.
        timeout: Seconds per attempt, the whole request (Tavily caps a search at 120, and a visit's
            extract at 60).
        backoff: First retry delay in seconds; doubles each retry, with jitter.

    Returns:
        ``[search, visit]``, async tools returning ``(text, {"doc_ids": [urls]})``.

    Raises:
        MissingTavilyKeyError: No key was given or found in ``TAVILY_API_KEY``.
        ConfigError: The key holds spaces, control or non-ASCII characters (no HTTP header can carry
            it), ``base_url`` is no ``http(s)://`` URL, or a limit is out of range.

    Example:
        >>> search, visit = make_tavily_tools(max_results=3)  # doctest: +SKIP
        >>> import asyncio
        >>> msg = asyncio.run(search.ainvoke(  # doctest: +SKIP
        ...     {"type": "tool_call", "id": "1", "name": "search", "args": {"query": "LangGraph"}}
        ... ))
        >>> urls = msg.artifact["doc_ids"]  # doctest: +SKIP
    """
    key, key_source = _key(api_key)
    web = _Tavily(
        key=key,
        key_source=key_source,
        base_url=base_url or None,
        max_results=max_results,
        max_chars=max_chars,
        retries=retries,
        timeout=timeout,
        backoff=backoff,
    )
    return [
        artifact_tool(
            web.search,
            name="search",
            description=SEARCH_DESCRIPTION.replace("the knowledge base", "the web"),
            schema=SearchInput,
        ),
        artifact_tool(
            web.visit,
            name="visit",
            description=VISIT_DESCRIPTION.replace("its id (or title)", "its URL"),
            schema=VisitInput,
        ),
    ]


def _key(api_key: str | None) -> tuple[str, str]:
    """The Tavily key to send, and where it was read from (``api_key``, else ``TAVILY_API_KEY``)."""
    # A key read from a file often ends in a line break, which httpx refuses in a header and then
    # prints, escaped, in its error: past any exact-match redaction.
    key = (api_key or os.environ.get("TAVILY_API_KEY") or "").strip()
    # Where a rejected key is to be fixed: "check TAVILY_API_KEY" sent a user who passed api_key= to a
    # variable the tools never read.
    source = "the api_key given to make_tavily_tools" if api_key else "TAVILY_API_KEY"
    if not key:
        raise MissingTavilyKeyError(
            "no Tavily API key: set the TAVILY_API_KEY environment variable or pass make_tavily_tools(api_key=...)"
        )
    if not fits_a_header(key):
        raise ConfigError(
            f"the Tavily API key ({source}) holds spaces, control characters or characters other than ASCII "
            "(curly quotes?): copy it again from app.tavily.com"
        )
    return key, source


@dataclass(frozen=True)
class _Tavily:
    """The two tools' bodies over one key and one set of limits."""

    key: str = field(repr=False)  # a secret: never printed
    key_source: str
    base_url: str | None
    max_results: int
    max_chars: int
    retries: int
    timeout: float
    backoff: float

    def __post_init__(self) -> None:
        problems = [
            f"{name}={value!r} must be {rule}"
            for name, value, ok, rule in [
                ("max_results", self.max_results, self.max_results >= 1, "at least 1"),
                ("max_chars", self.max_chars, self.max_chars >= 200, "at least 200"),
                ("retries", self.retries, self.retries >= 0, "0 or more"),
                ("timeout", self.timeout, self.timeout > 0, "positive"),
                ("backoff", self.backoff, self.backoff >= 0, "0 or more"),
                # Without a scheme every call failed, each a tool error the agent could do nothing about.
                (
                    "base_url",
                    self.base_url and shown_url(self.base_url),
                    self.base_url is None or is_http_url(self.base_url),
                    "an http:// or https:// URL",
                ),
            ]
            if not ok
        ]
        if problems:
            raise ConfigError(redact("make_tavily_tools: " + "; ".join(problems), [self.key]))

    def secrets(self) -> list[str]:
        """The secret values no output may hold: the key, and those of the environment (``OPENAI_API_KEY``, ...)."""
        # A local server's placeholder key ("ollama", "lm-studio", "not-needed", as their docs suggest) is
        # a word of the web too: replaced, it took "ollama.com" out of the result URLs visit is to open.
        # Only words are passed over: a digit is no test of a key, Hugging Face's (hf_ and 34 letters)
        # hold none and OpenAI's may not.
        keys = [s for s in secrets_of() if not _PLACEHOLDER.fullmatch(s)]
        return sorted({self.key, *keys}, key=lambda s: (-len(s), s))  # ties by text, not by hash order

    def redact(self, text: str) -> str:
        # Servers and proxies may echo request headers into error bodies; never pass the key on, nor
        # the model's key the trajectory would store with the page.
        # Only known values: a page's own "password: ..." or a link's "?sig=..." are what the web says.
        for secret in self.secrets():
            text = text.replace(secret, "***")
        return text

    async def call(self, op: Callable[[AsyncTavilyClient], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        attempt = 0
        while True:
            responses: list[httpx.Response] = []  # this attempt's response, once one came
            try:
                # A client per call: an httpx pool is bound to the event loop that opened it, and
                # the tools may be used from several loops (threads, asyncio.run per question).
                # The whole request, not each socket read: a server that drips bytes would outlast it.
                # Not the client's setup: the first loads the TLS certificates (0.4-1.3 s on a loaded
                # 2-core machine), which used up a 1 s timeout before a request was sent.
                async with _client(self.key, self.base_url, responses) as client:
                    async with asyncio.timeout(self.timeout):
                        data = await op(client)
                if not isinstance(data, dict):
                    raise TypeError(f"unexpected Tavily response of type {type(data).__name__}")
                return data
            except Exception as exc:
                status = responses[-1].status_code if responses else None
                said = _describe(exc, status, key_source=self.key_source, timeout=self.timeout)
                if not _is_transient(exc):
                    raise _Failed(said) from exc
                # A rate limit's Retry-After: retrying sooner is refused again, and a wait longer than
                # an attempt would outlast the tool call, so the agent is told it instead.
                asked = wait_asked(responses[-1].headers, cap=math.inf) if responses else 0.0
                # An ask longer than MAX_RETRY_AFTER (a day's quota) would be waited in vain each retry:
                # said as "at least" the cap. One of exactly the cap is waited when the timeout allows.
                capped = asked > MAX_RETRY_AFTER
                asked = min(asked, MAX_RETRY_AFTER)
                at_least = "at least " if capped else ""
                said += f"; Tavily asks to wait {at_least}{math.ceil(asked)} s before the next request" if asked else ""
                if capped or asked > self.timeout:
                    raise _Failed(said) from exc
                if attempt >= self.retries:
                    raise _Transient(said) from exc
                wait = max(asked, min(_MAX_BACKOFF, self.backoff * 2**attempt) * random.uniform(0.5, 1.5))
            await asyncio.sleep(wait)
            attempt += 1

    def failure(self, action: str, exc: _Failed) -> tuple[str, dict[str, Any]]:
        """The tool's output for a call Tavily failed: an error text naming Tavily, flagged as an error."""
        attempts = f" after {self.retries + 1} attempts" if isinstance(exc, _Transient) and self.retries else ""
        text = f"Error: {action} on Tavily failed{attempts} ({exc})."
        # An error's text also loses anything shaped like a key (a header error prints it escaped).
        return redact(text, self.secrets()), {"doc_ids": [], "error": True}

    async def search(self, query: str) -> tuple[str, dict[str, list[str]]]:
        if not query.strip():
            return EMPTY_QUERY, {"doc_ids": []}
        try:
            data = await self.call(lambda c: c.search(query, max_results=self.max_results, timeout=self.timeout))
        except _Failed as exc:
            return self.failure("web search", exc)
        # A URL is one word (spaces around it go): one holding a line break wrote hit lines of its own
        # into the output (a forged "[2] ... (id: ...)"), and one holding any space is no id visit opens.
        # The artifact's ids lose the key as the text does: a proxy that echoed it into a URL put it
        # into the trajectory's doc_ids, its checkpoints and --json output.
        urls = [(r, self.redact(r["url"]).split()) for r in _listed(data, "results") if isinstance(r.get("url"), str)]
        results = [{**r, "url": words[0]} for r, words in urls if len(words) == 1]
        if not results:
            return no_results(query), {"doc_ids": []}
        text, urls = _hits_text(results, max_chars=self.max_chars)
        return self.redact(text), {"doc_ids": urls}

    async def visit(self, doc: str, goal: str = "") -> tuple[str, dict[str, list[str]]]:
        url = _as_url(doc)
        if url is None:
            return (
                # "a URL" alone told a model that passed one with a space in it to pass what it had passed.
                f"No document {echo(doc.strip())}: visit needs a URL, without spaces (an id from the search results).",
                {"doc_ids": [], "error": True},
            )
        try:
            timeout = min(self.timeout, _EXTRACT_MAX_TIMEOUT)
            data = await self.call(lambda c: c.extract([url], format="text", timeout=timeout))
        except _Failed as exc:
            return self.failure(f"visit {url}", exc)
        pages = _listed(data, "results")
        content = str(pages[0].get("raw_content") or "") if pages else ""
        if not content.strip():
            reasons = [str(f["error"])[:200] for f in _listed(data, "failed_results") if f.get("error")]
            why = f" ({'; '.join(reasons)})" if reasons else ""
            return self.redact(f"No document could be read at {url}{why}."), {"doc_ids": [], "error": True}
        title = str(pages[0].get("title") or pages[0].get("url") or url)
        # A thread of its own: the excerpt of a page of megabytes takes seconds, during which the event
        # loop would run none of the other trajectories (22 s for a 5.6 MB page of short sentences).
        text = await asyncio.to_thread(visit_text, title, content, goal, max_chars=self.max_chars)
        return self.redact(text), {"doc_ids": [url]}


def _hits_text(results: list[dict[str, Any]], *, max_chars: int) -> tuple[str, list[str]]:
    """Search results as hits within ``max_chars``, and the URLs of those shown.

    Each hit is a title line holding its whole URL, then a snippet line. The best-ranked hits that
    fit with a short snippet each are shown, whole: a URL cut short would be a page the agent
    cannot visit, and one listed in the artifact but not shown a page it never saw. The snippets
    share the room the title lines leave, a short snippet's spare going to the others. The first
    hit is shown even if its URL alone outgrows ``max_chars``: there is no other answer to give.
    """
    title_chars = min(_TITLE_CHARS, max_chars // 4)
    heads, snippets = [], []
    for n, r in enumerate(results, 1):
        # One line per hit title: a newline in a page's title would forge a hit line of its own.
        title = " ".join(str(r.get("title") or r["url"]).split())
        if len(title) > title_chars:
            title = title[: title_chars - 1].rstrip() + "…"
        heads.append(f"[{n}] {title} (id: {r['url']})")
        snippets.append(" ".join(str(r.get("content") or "").split()))
    used, kept = 0, 0
    for head, snippet in zip(heads, snippets, strict=True):
        # A hit costs its title line, a line break, the shortest snippet worth showing and the
        # blank line before it.
        cost = len(head) + 1 + min(len(hit_text(snippet)), _MIN_SNIPPET) + (2 if kept else 0)
        if kept and used + cost > max_chars:
            break
        used, kept = used + cost, kept + 1
    spare = max_chars - sum(len(h) + 1 for h in heads[:kept]) - 2 * (kept - 1)
    budgets = [0] * kept
    wants = [len(hit_text(snippet)) for snippet in snippets[:kept]]
    for done, i in enumerate(sorted(range(kept), key=wants.__getitem__)):
        budgets[i] = max(min(wants[i], spare // (kept - done)), 0)
        spare -= budgets[i]
    hits = [f"{h}\n{_snippet(s, b)}" for h, s, b in zip(heads, snippets, budgets, strict=False)]
    return "\n\n".join(hits), [r["url"] for r in results[:kept]]


def _snippet(text: str, limit: int) -> str:
    """A hit's snippet line cut to at most ``limit`` characters (ending in "…" when cut)."""
    for room in (limit, limit - 1):  # hit_text may add a backslash
        line = hit_text(text if len(text) <= room else text[: max(room - 1, 0)].rstrip() + "…")
        if len(line) <= limit:
            return line
    return ""


def _listed(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The objects of a list field of a Tavily response; anything else there counts as none."""
    value = data.get(key)
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _is_transient(exc: Exception) -> bool:
    # The client wraps only timeouts: a refused or dropped connection reaches us as httpx's own error;
    # TimeoutError is the attempt's own bound.
    transport = (TimeoutError, httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
    if isinstance(exc, (UsageLimitExceededError, TavilyTimeoutError, *transport)):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code >= 500


def _tls() -> ssl.SSLContext:
    """The TLS settings every client shares: loading the certificates takes 0.1 s (up to 1.3 s on a
    loaded machine), and a client made per call loaded them on the event loop, which ran no other
    trajectory meanwhile (16 searches at once stalled it 1.6 s)."""
    # Made again when the CA bundle variables httpx reads change: one set after the first call (a
    # notebook's fix for a company proxy that inspects TLS) was ignored until a restart.
    return _tls_for(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls_for(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    """:func:`_tls` for the given ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` (httpx reads them itself)."""
    del cafile, capath  # the cache's key
    return httpx.create_ssl_context()


@contextlib.asynccontextmanager
async def _client(key: str, base_url: str | None, responses: list[httpx.Response]) -> AsyncIterator[AsyncTavilyClient]:
    """A Tavily client on an httpx client of ours, closed when the block ends; each response it gets
    is appended to ``responses``.

    The client's errors do not carry the response (one error stands for 403, 432 and 433; a 429 has
    no Retry-After; a 202 ends in a TypeError), so a response hook notes it. A loopback ``base_url``
    (a local gateway, a test server) is asked directly: through the environment's proxy
    (``http_proxy`` without ``no_proxy``), its requests failed and handed the proxy the key. Another
    goes through the environment's proxy or the Tavily client's own ``TAVILY_HTTP_PROXY`` and
    ``TAVILY_HTTPS_PROXY``, which it reads only for a client it makes itself.
    """

    async def note(response: httpx.Response) -> None:
        responses.append(response)

    direct = bool(base_url) and is_loopback(urllib.parse.urlsplit(base_url).hostname)
    proxies = {} if direct else {f"{s}://": os.environ.get(f"TAVILY_{s.upper()}_PROXY") for s in ("http", "https")}
    mounts = {
        scheme: httpx.AsyncHTTPTransport(proxy=proxy, verify=_tls()) for scheme, proxy in proxies.items() if proxy
    }
    async with httpx.AsyncClient(
        verify=_tls(), trust_env=not direct, mounts=mounts, event_hooks={"response": [note]}
    ) as http:
        yield AsyncTavilyClient(api_key=key, api_base_url=base_url, client=http)


def _describe(exc: Exception, status: int | None, *, timeout: float, key_source: str = "TAVILY_API_KEY") -> str:
    """What went wrong, for the agent and the trajectory: the HTTP status and what it means when known.

    Example:
        >>> _describe(ForbiddenError("This request exceeds your plan's set usage limit."), 432, timeout=10)
        "HTTP 432: Tavily plan limit reached; This request exceeds your plan's set usage limit."
        >>> _describe(json.JSONDecodeError("Expecting value", "<html>", 0), 200, timeout=10)
        'Tavily sent a response that is not JSON (HTTP 200)'
    """
    detail = " ".join(str(exc).split())
    if isinstance(exc, UsageLimitExceededError):
        return f"rate limited (HTTP 429){': ' + detail if detail else ''}"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code} from {exc.request.url.host}"
    if isinstance(exc, _REFUSALS) and status is not None:
        meaning = _REFUSAL_MEANINGS.get(status, "Tavily refused the request")
        meaning += f": check {key_source}" if status == 401 else ""
        return f"HTTP {status}: {meaning}{'; ' + detail if detail else ''}"
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):  # a proxy's or a captive portal's page
        return "Tavily sent a response that is not JSON" + (f" (HTTP {status})" if status else "")
    if status is not None and 200 < status < 300:  # a success the client cannot read (it raises a TypeError)
        return f"HTTP {status}: Tavily sent no results"
    if status == 200 and isinstance(exc, AttributeError | TypeError):  # JSON of another shape (a list, a string)
        return "HTTP 200: Tavily sent JSON that is no search or extract response"
    if isinstance(exc, TimeoutError) and not detail:  # the attempt's own bound
        return f"no answer within {timeout:g} s"
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _as_url(doc: str) -> str | None:
    text = doc.strip().strip("\"'`<>")
    text = pasted_id(text) or text
    if _URL_RE.match(text):
        return text
    if _BARE_DOMAIN_RE.match(text):
        return f"https://{text}"
    return None
