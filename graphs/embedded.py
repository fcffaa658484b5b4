"""The embedded default for LangGraph Studio / ``langgraph dev``: SmolLM2 in-process + offline Wikipedia.

No custom checkpointer: the LangGraph server supplies one for the outer graph (trajectory
snapshots stay in the graph's own in-memory saver).
"""

from langgraph_parallelmuse import LocalChatModel, create_parallelmuse
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools

graph = create_parallelmuse(
    LocalChatModel.embedded(),
    make_corpus_tools(CorpusIndex.wikipedia()),
    name="parallelmuse-embedded",
)
