"""The checkpointer ``langgraph dev --config langgraph.postgres.json`` uses: PostgreSQL at ``PARALLELMUSE_DB``.

``PARALLELMUSE_DB`` is a ``postgresql://`` URL (a SQLite path works too); the server enters the
returned context manager once, so checkpoints of every run land there and survive a restart.
"""

import os

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.persistence import open_checkpointer


def checkpointer():
    """The server's checkpointer, opened (and its tables set up) on ``PARALLELMUSE_DB``."""
    target = os.environ.get("PARALLELMUSE_DB")
    if not target:
        raise ConfigError("set PARALLELMUSE_DB to a postgresql:// URL to keep `langgraph dev` checkpoints in Postgres")
    return open_checkpointer(target)
