"""The embedded default for LangGraph Studio / ``langgraph dev``: SmolLM2 + offline Wikipedia.

No custom checkpointer: the LangGraph server supplies one for the outer graph (trajectory
snapshots stay in the graph's own in-memory saver).

The model is loaded here, at import: the server imports graph files in a worker thread, where
blocking is fine. Loaded lazily, the first access (torch import, GGUF read) would run inside the
server's event loop, which ``langgraph dev`` refuses (blockbuster ``BlockingError``).
"""

from langgraph_parallelmuse import LocalChatModel, create_parallelmuse
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools

model = LocalChatModel.embedded()
model.engine  # noqa: B018 - load the weights now (see above)

graph = create_parallelmuse(
    model,
    make_corpus_tools(CorpusIndex.wikipedia()),
    name="parallelmuse-embedded",
)
