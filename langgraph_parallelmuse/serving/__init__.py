"""Start and stop real local servers (vLLM, a router, PostgreSQL) for tests and benchmarks.

Every server binds 127.0.0.1 on a free port, stops by itself after a maximum time and when the
process that started it dies, and is torn down by process group; a server that does not come up
raises a :class:`ServerError` naming the command, the port and the tail of its log
(:mod:`~langgraph_parallelmuse.serving.process`). vLLM and the routers come from the serving
virtualenv (``scripts/setup-serving.sh VENV``); PostgreSQL is Debian's ``postgresql-15``.

Example:
    >>> from langgraph_parallelmuse.serving import serve, vllm_spec, router_server
    >>> specs = [vllm_spec("/tmp/smollm2", venv=".venv-serving") for _ in range(2)]  # doctest: +SKIP
    >>> with serve(specs) as workers:  # doctest: +SKIP
    ...     with router_server([w.url for w in workers], venv=".venv-serving") as router:
    ...         print(router.url, router.routing_header)
    http://127.0.0.1:40123 x-session-id
"""

from langgraph_parallelmuse.serving.postgres import postgres_server, postgres_spec
from langgraph_parallelmuse.serving.process import (
    Server,
    ServerError,
    ServerSpec,
    free_port,
    group_members,
    serve,
    stop_group,
)
from langgraph_parallelmuse.serving.routers import ROUTERS, RouterKind, router_server, router_spec
from langgraph_parallelmuse.serving.vllm import (
    reset_prefix_cache,
    vllm_command,
    vllm_counters,
    vllm_server,
    vllm_spec,
)

__all__ = [
    "ROUTERS",
    "RouterKind",
    "Server",
    "ServerError",
    "ServerSpec",
    "free_port",
    "group_members",
    "postgres_server",
    "postgres_spec",
    "reset_prefix_cache",
    "router_server",
    "router_spec",
    "serve",
    "stop_group",
    "vllm_command",
    "vllm_counters",
    "vllm_server",
    "vllm_spec",
]
