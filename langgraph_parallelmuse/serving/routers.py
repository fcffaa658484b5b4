"""Routers in front of several OpenAI-compatible replicas: ``vllm-router`` and ``sglang-router``.

Both are Rust wheels on PyPI (no vLLM or SGLang inside); they live in the serving virtualenv. A
replica's prefix cache only helps the requests that reach it, so every call of one question must
carry one routing key in the header the router's sticky policy reads (:data:`ROUTERS`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.serving.process import (
    HOST,
    LOOPBACK_ONLY,
    Server,
    ServerSpec,
    free_ports,
    http_ready,
    refuse_own_flags,
    serve_one,
    venv_bin,
)


@dataclass(frozen=True)
class RouterKind:
    """How to launch a router and which header pins a request to a worker.

    Attributes:
        argv: The launch command (its first item is in the serving venv's ``bin``).
        sticky_policy: The ``--policy`` that routes by ``routing_header``.
        routing_header: The request header that ``sticky_policy`` reads.
        policies: The ``--policy`` values the pinned release takes (its argparse ``choices``);
            empty: not checked here.
    """

    argv: tuple[str, ...]
    sticky_policy: str
    routing_header: str
    policies: tuple[str, ...] = ()


ROUTERS = {
    # --policy consistent_hash: a hash ring over X-Session-ID (then X-User-ID, ..., then the body).
    # Forwards the request body as sent.
    "vllm-router": RouterKind(
        ("vllm-router",),
        "consistent_hash",
        "x-session-id",
        # vllm-router 0.1.17 (scripts/setup-serving.sh), vllm_router/router_args.py --policy choices.
        ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash", "sticky_least_loaded"),
    ),
    # --policy manual: a key is assigned a worker on first sight, then always goes there. 0.3.2
    # re-serialises the body in SGLang's schema: it drops add_generation_prompt (so a vLLM worker
    # refuses continue_final_message with HTTP 400) and renames max_tokens to max_completion_tokens.
    # Fine for SGLang workers; in front of vLLM only for new turns (the free driver).
    "sglang-router": RouterKind(
        ("sglang-router", "launch"),
        "manual",
        "x-smg-routing-key",
        # sglang-router 0.3.2, sglang_router/router_args.py --policy choices.
        ("random", "round_robin", "cache_aware", "power_of_two", "manual"),
    ),
}


def router_spec(
    worker_urls: Sequence[str],
    *,
    venv: str | Path,
    kind: str = "vllm-router",
    policy: str | None = None,
    extra_args: Sequence[str] = (),
) -> ServerSpec:
    """A router in front of OpenAI-compatible workers, on a free port (see :func:`router_server`).

    Raises:
        ConfigError: ``worker_urls`` is empty, a string, or holds a URL that is not
            ``http(s)://HOST:PORT`` (port 1-65535, no path) or is listed twice; ``kind`` is
            unknown; ``policy`` is not one the router takes; ``extra_args`` is a string or sets a
            flag set here (``--host``, ``--port``, ``--worker-urls``, ``--policy``, ``--prometheus-*``).

    Example:
        >>> router_spec([], venv=".venv-serving")
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ConfigError: router: pass at least one worker URL (worker_urls=)
    """
    if kind not in ROUTERS:
        raise ConfigError(f"router kind={kind!r}: use one of {', '.join(ROUTERS)}")
    if isinstance(worker_urls, str):
        raise ConfigError(
            f"router worker_urls={worker_urls!r} is one string: pass a list of URLs, e.g. [{worker_urls!r}]"
        )
    if not worker_urls:
        raise ConfigError("router: pass at least one worker URL (worker_urls=)")
    for worker in worker_urls:
        _check_worker_url(worker)
    if len(set(worker_urls)) != len(worker_urls):
        twice = sorted({w for w in worker_urls if list(worker_urls).count(w) > 1})
        raise ConfigError(f"router worker_urls lists {', '.join(twice)} more than once: list each worker once")
    router = ROUTERS[kind]
    if policy is not None and router.policies and policy not in router.policies:
        raise ConfigError(f"router policy={policy!r}: {kind} takes one of {', '.join(router.policies)}")
    if isinstance(extra_args, str):
        raise ConfigError(f"router extra_args={extra_args!r}: one string, not a list: pass a list of arguments")
    listening = dict.fromkeys(
        ("--host", "--port", "--prometheus-host", "--prometheus-port"), f"drop it ({LOOPBACK_ONLY})"
    )
    chosen = {"--worker-urls": "pass the workers as worker_urls", "--policy": "pass policy="}
    refuse_own_flags("router", extra_args, {**listening, **chosen})
    port, metrics_port = free_ports(2)  # two free_port() calls could return one port twice
    argv = (
        venv_bin(venv, router.argv[0]),
        *router.argv[1:],
        *("--host", HOST, "--port", str(port)),
        "--worker-urls",
        *worker_urls,
        *("--policy", policy or router.sticky_policy),
        # Both export Prometheus metrics on a fixed default port (29000): a second router would
        # fail to start ("Address already in use").
        *("--prometheus-host", HOST, "--prometheus-port", str(metrics_port)),
        *extra_args,
    )
    url = f"http://{HOST}:{port}"
    ready = http_ready(f"{url}/readiness", functools.partial(_all_healthy, len(worker_urls)))
    return ServerSpec(kind, argv, port, url, ready, {"NO_COLOR": "1"}, routing_header=router.routing_header)


def _all_healthy(workers: int, body: str) -> bool:
    """Whether a ``/readiness`` reply (200 once the router is up) counts every worker registered healthy."""
    try:
        health = json.loads(body)
    except ValueError:
        return False
    return isinstance(health, dict) and health.get("healthy_workers") == workers


def _check_worker_url(worker: object) -> None:
    """Refuse a worker URL the router could never reach: it would wait for it until the startup timeout."""
    example = "e.g. http://127.0.0.1:8001 (a Server.url)"
    if not isinstance(worker, str):
        raise ConfigError(f"router worker URL {worker!r} is not a string: give each as {example}")
    parts = urlsplit(worker)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"router worker URL {worker!r} has no http:// scheme or host: write it as {example}")
    try:
        parts.port  # noqa: B018 - raises on a port outside 0-65535 or not a number
    except ValueError:
        raise ConfigError(
            f"router worker URL {worker!r}: its port is not a TCP port: use a number from 1 to 65535, {example}"
        ) from None
    if parts.port == 0:
        raise ConfigError(f"router worker URL {worker!r}: port 0 is not a TCP port: use 1 to 65535, {example}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(
            f"router worker URL {worker!r}: give the worker's root URL, without a path such as /v1: {example}"
        )


@contextmanager
def router_server(
    worker_urls: Sequence[str],
    *,
    venv: str | Path,
    startup_timeout: float = 120.0,
    max_seconds: float = 3600.0,
    log_dir: str | Path | None = None,
    **options: Any,
) -> Iterator[Server]:
    """Run a router in front of running workers until the block ends.

    Args:
        worker_urls: The workers' root URLs (``Server.url``).
        venv: The serving virtualenv holding the routers.
        options: ``kind`` (``vllm-router``, or ``sglang-router``: see :data:`ROUTERS` for what it
            does to vLLM requests), ``policy`` (default: the kind's
            sticky policy; the returned ``Server.routing_header`` names the header it reads;
            ``round_robin`` is what scatters one question over the workers), ``extra_args``.
        startup_timeout, max_seconds, log_dir: As in :func:`serve`.

    Example:
        >>> with router_server(["http://127.0.0.1:8001"], venv=".venv-serving") as r:  # doctest: +SKIP
        ...     r.routing_header
        'x-session-id'
    """
    spec = router_spec(worker_urls, venv=venv, **options)
    yield from serve_one(spec, startup_timeout=startup_timeout, max_seconds=max_seconds, log_dir=log_dir)
