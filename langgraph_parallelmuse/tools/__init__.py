"""Search tools for the research agent: an offline BM25 corpus index and online Tavily search.

Example:
    >>> from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools
    >>> search, visit = make_corpus_tools(CorpusIndex.wikipedia())
"""

from langgraph_parallelmuse.tools.corpus import (
    CorpusError,
    CorpusIndex,
    Doc,
    Hit,
    default_cache_dir,
    fts_query,
    slugify,
)
from langgraph_parallelmuse.tools.local_tools import (
    SearchInput,
    ToolArgumentError,
    VisitInput,
    goal_excerpt,
    make_corpus_tools,
)
from langgraph_parallelmuse.tools.tavily import MissingTavilyKeyError, make_tavily_tools

__all__ = [
    "CorpusError",
    "CorpusIndex",
    "Doc",
    "Hit",
    "MissingTavilyKeyError",
    "SearchInput",
    "ToolArgumentError",
    "VisitInput",
    "default_cache_dir",
    "fts_query",
    "goal_excerpt",
    "make_corpus_tools",
    "make_tavily_tools",
    "slugify",
]
