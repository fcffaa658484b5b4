"""The embedded default for LangGraph Studio / ``langgraph dev``: SmolLM2 + offline Wikipedia.

No custom checkpointer: the LangGraph server supplies one, and the trajectory threads are kept
there too (``langgraph.postgres.json``: in PostgreSQL, so a restarted server resumes a run).

The model is loaded here, at import: the server imports graph files in a worker thread, where
blocking is fine. Loaded lazily, the first access (torch import, GGUF read) would run inside the
server's event loop, which ``langgraph dev`` refuses (blockbuster ``BlockingError``).

``graph`` is a zero-argument graph factory: without the ``local`` extra or the data wheels the
import still succeeds, so the server and its other graphs start, and each run of this graph fails
with the error that names what to install.
"""

from langgraph.graph.state import CompiledStateGraph

from langgraph_parallelmuse import LocalChatModel, ParallelMuseError, create_parallelmuse
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools

try:
    model = LocalChatModel.embedded()
    model.engine  # noqa: B018 - load the weights now (see above)
    _graph: CompiledStateGraph | None = create_parallelmuse(
        model,
        make_corpus_tools(CorpusIndex.wikipedia()),
        name="parallelmuse-embedded",
    )
    _unavailable: ParallelMuseError | None = None
except ParallelMuseError as exc:  # raised on purpose: a missing package, named in the message
    _graph, _unavailable = None, exc


def graph() -> CompiledStateGraph:
    """The compiled graph, built at import (raises why it could not be, on every use)."""
    if _unavailable is not None:
        raise _unavailable
    return _graph
