"""HTTP to this machine's loopback never goes through the environment's proxy.

``http_proxy`` (or ``HTTP_PROXY``) without ``no_proxy`` sends every request to the proxy, a
``127.0.0.1`` one too: a proxy cannot reach this host's loopback (a remote one answers for its own,
or fails), and the request hands it its ``Authorization`` header (a local vLLM's key). The library's
own HTTP calls (:func:`~langgraph_parallelmuse.models.server.check_server`, the serving readiness
probes and counters) go through :func:`open_url`; ``ServerChatModel``'s clients ask
:func:`is_loopback` of their base URL. A remote URL (a user's vLLM elsewhere) may need the proxy
and keeps it. A redirect :func:`open_url` follows to another origin leaves the request's credentials behind.
"""

from __future__ import annotations

import http.client
import ipaddress
import re
import urllib.parse
import urllib.request
from typing import Any


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` names this machine's loopback (``localhost``, 127.0.0.0/8, ``::1``, ``0.0.0.0``).

    A connection to the unspecified address (``0.0.0.0``, ``::``) reaches this machine: vLLM started
    with ``--host 0.0.0.0`` prints ``http://0.0.0.0:8000`` as its URL, and a proxy asked for it
    would reach its own host instead.

    Args:
        host: A URL's host, as ``urllib.parse.urlsplit(url).hostname`` gives it (IPv6 with or
            without brackets).

    Returns:
        ``True`` for ``localhost`` and its subdomains, 127.0.0.0/8 (IPv4-mapped ``::ffff:127.0.0.1``
        too), ``::1``, ``0.0.0.0`` and ``::``;
        ``False`` for anything else, an empty or missing host included.

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("[::1]"), is_loopback("10.0.0.7")
        (True, True, True, False)
        >>> is_loopback("0.0.0.0")
        True
    """
    if not host:
        return False
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a host name
        return False
    # Python 3.11 calls ::ffff:127.0.0.1, which reaches this machine's 127.0.0.1, no loopback address.
    address = getattr(address, "ipv4_mapped", None) or address
    return address.is_loopback or address.is_unspecified


def is_http_url(url: str) -> bool:
    """Whether ``url`` is an ``http://`` or ``https://`` URL with a host.

    A base URL without its scheme (``127.0.0.1:8000/v1``) failed every call later with an error
    that named no URL ("Connection error."): the clients check theirs with this when they are built.

    Example:
        >>> is_http_url("http://127.0.0.1:8000/v1"), is_http_url("127.0.0.1:8000/v1"), is_http_url("http://:8000/v1")
        (True, False, False)
    """
    # urlsplit strips the blanks around a URL, the clients do not: a pasted "http://h/v1 " asked for
    # /v1%20/chat/completions (a 404), and one with a blank before it for no URL at all.
    if not url.isprintable() or url != url.strip():
        return False
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket
        return False
    # The host, not the netloc: "http://:8000/v1" has one, and httpx refused every call to it as
    # "missing an 'http://' or 'https://' protocol".
    return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)


def shown_url(url: str) -> str:
    """``url`` as an error may show it: a user and password before its host masked.

    Also without a scheme, where :func:`~langgraph_parallelmuse.redact.redact`'s URL patterns (they
    need ``://``) do not reach: a base URL refused for its missing scheme printed its password.

    Example:
        >>> shown_url("admin:pa55word@127.0.0.1:8000/v1"), shown_url("http://u:p@h/v1?q=a@b")
        ('***@127.0.0.1:8000/v1', 'http://***@h/v1?q=a@b')
    """
    return re.sub(r"^((?:[A-Za-z][A-Za-z0-9+.-]*://)?)[^/?#\s]*@", r"\1***@", url)


class _LoopbackDirect(urllib.request.ProxyHandler):
    """The environment's proxies (``http_proxy``, ``no_proxy``), except for a loopback host.

    Decided per request, so a loopback server is asked directly also after a redirect.
    """

    def proxy_open(self, req: urllib.request.Request, proxy: str, type: str) -> Any:  # noqa: A002 - urllib's name
        if is_loopback(urllib.parse.urlsplit(req.full_url).hostname):
            return None  # the next handler (HTTPHandler) connects directly
        return super().proxy_open(req, proxy, type)


# The headers a redirect to another origin drops (urllib's own spelling, ``str.capitalize``d).
_CREDENTIALS = ("Authorization", "Cookie", "Proxy-authorization")


def _origin(url: str) -> tuple[str, str | None, int | None]:
    """A URL's scheme, host and port (the scheme's default when none is written)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(scheme)


def _same_site(old: str, new: str) -> bool:
    """Whether a redirect from ``old`` to ``new`` stays where the credentials were given: the same origin,
    or the same host's upgrade from http (port 80) to https (port 443), which httpx keeps them for too
    (a server behind a proxy that forces HTTPS)."""
    was, now = _origin(old), _origin(new)
    return was == now or (was[1] == now[1] and was[::2] == ("http", 80) and now[::2] == ("https", 443))


class _CredentialsStayHome(urllib.request.HTTPRedirectHandler):
    """Redirects as urllib follows them, but a request's credentials only to the site they were given for.

    urllib copies every header onto the redirected request: a server that answered ``check_server``'s
    ``GET /models`` with a redirect to another host was handed the API key (httpx, under the openai
    client, drops it the same way).
    """

    def redirect_request(self, req: urllib.request.Request, *args: Any, **kwargs: Any) -> Any:
        new = super().redirect_request(req, *args, **kwargs)
        if new is not None and not _same_site(req.full_url, new.full_url):
            for name in _CREDENTIALS:
                new.remove_header(name)
        return new


def open_url(request: urllib.request.Request, *, timeout: float) -> http.client.HTTPResponse:
    """``urllib.request.urlopen(request)``, but a loopback URL never goes through a proxy, and a
    redirect to another origin (scheme, host or port) does not carry the request's credentials.

    The opener is built per call, so the proxy variables are read as they are now (``urlopen``
    reads them once per process).

    Args:
        request: The request, its headers included.
        timeout: Seconds for the connection and each read.

    Returns:
        The response, to use as a context manager.

    Raises:
        urllib.error.URLError: As ``urlopen`` (``HTTPError`` for an HTTP error status).

    Example:
        >>> import urllib.error
        >>> from langgraph_parallelmuse.serving import free_port
        >>> try:  # asked directly, with or without http_proxy set: nothing listens there
        ...     open_url(urllib.request.Request(f"http://127.0.0.1:{free_port()}/"), timeout=2)
        ... except urllib.error.URLError as exc:
        ...     print("unreachable:", type(exc.reason).__name__)
        unreachable: ConnectionRefusedError
    """
    return urllib.request.build_opener(_LoopbackDirect(), _CredentialsStayHome()).open(request, timeout=timeout)
