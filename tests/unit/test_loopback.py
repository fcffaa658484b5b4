"""open_url against loopback servers: what a redirect carries to the server it points at."""

from __future__ import annotations

import pytest

from langgraph_parallelmuse.models.server import ServerCheckError, served_models
from tests.unit.http_fakes import fake_http, redirecting_http

MODELS = {"GET /v1/models": lambda _body: (200, {"object": "list", "data": [{"id": "smollm2"}]})}


def test_a_redirect_to_another_host_does_not_carry_the_api_key() -> None:
    """Before: urllib copied every header onto the redirected request, and a server that redirected
    check_server's GET /models elsewhere was handed the key (``localhost`` is another host than
    ``127.0.0.1``, as a browser and httpx count origins)."""
    with fake_http(MODELS) as other:
        elsewhere = other.url.replace("127.0.0.1", "localhost")
        with redirecting_http(f"{elsewhere}/v1/models") as redirect:
            assert served_models(f"{redirect.url}/v1", api_key="sk-secret-key") == ["smollm2"]
        assert redirect.requests[0].headers["authorization"] == "Bearer sk-secret-key"
        assert [r.path for r in other.requests] == ["/v1/models"]
        assert "authorization" not in other.requests[0].headers


def test_a_redirect_on_the_same_origin_keeps_the_api_key() -> None:
    """A guard: a server that redirects to itself (here in a loop, which urllib gives up on) gets the key
    each time, however the redirect rule for other origins changes."""
    with redirecting_http("/v1/models") as redirect:
        with pytest.raises(ServerCheckError):
            served_models(f"{redirect.url}/v1", api_key="sk-secret-key")
    assert len(redirect.requests) > 1
    assert all(r.headers.get("authorization") == "Bearer sk-secret-key" for r in redirect.requests)


@pytest.mark.parametrize(
    ("old", "new", "same"),
    [
        ("http://vllm.example.org/v1/models", "https://vllm.example.org/v1/models", True),  # HTTPS forced
        ("http://vllm.example.org:80/v1", "https://VLLM.example.org:443/v1", True),
        ("http://vllm.example.org:8000/v1", "https://vllm.example.org/v1", False),  # another port: another server
        ("https://vllm.example.org/v1", "http://vllm.example.org/v1", False),  # a downgrade
        ("http://vllm.example.org/v1", "https://evil.example.org/v1", False),
    ],
)
def test_the_key_follows_a_redirect_only_on_its_site_and_its_upgrade_to_https(old: str, new: str, same: bool) -> None:
    """The upgrade from http to https on the same host keeps the key (as httpx keeps it): this session's
    first rule dropped it there, and a remote server behind a proxy that forces HTTPS got a 401."""
    from langgraph_parallelmuse.loopback import _same_site

    assert _same_site(old, new) is same
