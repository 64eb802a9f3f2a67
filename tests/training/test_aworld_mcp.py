"""AWorld's ``Agent(mcp_config=..., mcp_servers=[...])``: this chat agent does not run MCP servers
(docs/aworld.md says why). AWorld's own MCP example (``tests/fixtures/aworld_mcp_tool_run.py``,
imports changed) is refused naming what to do instead, and that advice holds: the ``mcpServers``
entries of a stdio server, as AWorld writes them (its BFCL example: ``command`` and ``args``), are
what rLLM's MCP environment takes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from training.chat_agent import Agent
from training.compat.rllm.mcp_env import MCPEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import aworld_mcp_tool_run as example  # noqa: E402  (AWorld's example)


def test_aworlds_mcp_example_is_refused_naming_what_to_do_instead():
    with pytest.raises(ValueError) as error:
        example.build_agent()
    message = str(error.value)
    assert message.startswith("agent 'search_agent': mcp_") and "this chat agent does not run MCP servers" in message
    assert "@be_tool" in message and "env_class=MCPEnvironment" in message and "mcp_config['mcpServers']" in message
    assert "Servers reached by URL (sse, streamable-http) are not supported" in message  # the example's server is one


@pytest.mark.parametrize("field", ["mcp_servers", "mcp_config"])
def test_each_mcp_field_alone_is_refused(field):
    with pytest.raises(ValueError, match=rf"^agent 'a': {field}: this chat agent does not run MCP servers"):
        Agent(name="a", **{field: ["x"] if field == "mcp_servers" else {"mcpServers": {}}})


ECHO = ("from mcp.server.mcpserver import MCPServer\nserver = MCPServer('echo')\n"
        "@server.tool(description='Say it back.')\ndef echo(text: str) -> str:\n    return text.upper()\nserver.run('stdio')")


def test_aworlds_stdio_server_entries_run_in_rllms_mcp_environment():
    mcp_config = {"mcpServers": {"echo-server": {"command": sys.executable, "args": ["-c", ECHO]}}}  # AWorld's form
    env = MCPEnvironment.from_dict({"question": "say hi", "ground_truth": "HI", "mcp_servers": mcp_config["mcpServers"]})
    try:
        assert "echo" in env.tool_map
        observation, reward, done, info = env.step([{"id": "1", "function": {"name": "echo", "arguments": '{"text": "hi"}'}}])
        assert list(observation["tool_outputs"].values()) == ["HI"]
    finally:
        env.close()
