"""An MCP server over stdio, written with the ``mcp`` SDK's ``MCPServer``, searching a few
HotpotQA-style documents held in memory. It stands in for the web-search server that rLLM's MCP
example starts (``npx -y tavily-mcp``: Tavily's paid API, fetched from npm): its search tool
carries that server's name, ``tavily-search``, so the example's hyphenated tool names (and rLLM's
``tavily_search`` alias for them) are exercised as they are there.

    python tests/standins/mcp_search_server.py       # speaks MCP on stdin/stdout

Tools:

- ``tavily-search(query, max_results=2)``: the documents sharing the most words with the query,
  best first, as ``[title] text`` lines.
- ``lookup(title)``: one document by its exact title; an unknown title raises ``KeyError``, which
  the SDK reports to the client as a tool error (``is_error``).

Environment variables, for the tests: ``SEARCH_DELAY_S`` makes every search wait that long before
answering (call timeouts); ``MCP_SEARCH_LOG`` names a file to which the server appends one line
when it starts (``start <pid>``), per call (``call <tool> <argument>``) and when it exits
(``exit <pid>``), so a test can tell which servers ran and that they ended.
"""

from __future__ import annotations

import os
import re
import time

from mcp.server.mcpserver import MCPServer

DOCUMENTS = {
    "Scott Derrickson": "Scott Derrickson is an American director, screenwriter and producer, born in Denver.",
    "Ed Wood": "Edward Davis Wood Jr. was an American filmmaker, actor and author, born in Poughkeepsie, New York.",
    "Arthur's Magazine": "Arthur's Magazine was an American literary periodical published in Philadelphia from 1844.",
    "First for Women": "First for Women is a woman's magazine published in the USA, started in 1989.",
    "The Oberoi Group": "The Oberoi Group is a hotel company with its head office in Delhi.",
    "Shirley Temple": "Shirley Temple played Corliss Archer in Kiss and Tell and later served as Chief of Protocol of the United States.",
}

server = MCPServer("hotpotqa-search")


def _log(line: str) -> None:
    path = os.environ.get("MCP_SEARCH_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(line + "\n")


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


@server.tool(name="tavily-search", description="Search the encyclopedia for documents about a query.")
def search(query: str, max_results: int = 2) -> str:
    _log(f"call tavily-search {query}")
    time.sleep(float(os.environ.get("SEARCH_DELAY_S", "0")))
    wanted = _words(query)
    ranked = sorted(DOCUMENTS.items(), key=lambda item: -len(wanted & _words(item[0] + " " + item[1])))
    return "\n".join(f"[{title}] {text}" for title, text in ranked[:max_results])


@server.tool(description="The document with exactly this title.")
def lookup(title: str) -> str:
    _log(f"call lookup {title}")
    return DOCUMENTS[title]  # an unknown title raises KeyError: a tool error for the client


if __name__ == "__main__":
    _log(f"start {os.getpid()}")
    try:
        server.run("stdio")
    finally:
        _log(f"exit {os.getpid()}")
