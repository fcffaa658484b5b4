"""Fixtures of the reliability suite."""

from __future__ import annotations

import pytest

from langgraph_parallelmuse import retry


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the library's retry policy (2 retries, transient errors only) but back off in ms."""
    monkeypatch.setattr(retry.with_retries, "__kwdefaults__", {"retries": 2, "base_delay": 0.005})


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
