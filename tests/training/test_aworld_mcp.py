"""AWorld's ``Agent(mcp_config=..., mcp_servers=[...])``: its MCP servers' tools are the agent's.

AWorld's BFCL example (``tests/fixtures/aworld_bfcl_run.py``, imports changed) trains here with its
stdio server, started from the example's folder as the example starts it (``python
mcp_tools/gorilla_file_system.py``; the server is a small stand-in written with the ``mcp`` SDK).
Each stdio server runs in the platform's jail, and each URL server is reached only through the
egress guard: the attacks are replayed (a server reading outside its jail, reaching the network,
reading the trainer's environment; a URL at loopback or at the cloud's metadata address, with the
up-front check bypassed too).

The scripted episodes are driven by ``ScriptedGenerator`` (a stand-in for the model that writes
given replies, so that tool calls happen on cue); servers, jail, guard, agent, tokenizer and
reward are real.
"""

from __future__ import annotations

import socket
import subprocess
import time
import sys
from pathlib import Path

import pytest
import yaml

from test_aworld_agent import TOKENIZER, ScriptedGenerator
from training import AgentTrainer
from training.chat_agent import Agent
from training.config import Config
from training.errors import MCPServerError
from training.isolation import egress
from training.rewards import load_reward
from training.rollouts.episode_runner import EpisodeRunner
from training.types import TerminationReason

from standins.http import LoopbackServer, Response

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
import aworld_bfcl_run as bfcl  # noqa: E402  (AWorld's example)
import aworld_mcp_tool_run as calculator  # noqa: E402  (AWorld's example: an SSE server at 127.0.0.1:8500)

TASK = {"prompt": "Write 'AWorld' into hello_world.py and show the file.", "ground_truth": "AWorld"}
CONFIG = {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
          "data.max_prompt_length": 2048, "data.max_response_length": 8, "rllm.agent.max_tokens_per_turn": 8,
          "trainer.total_training_steps": 1, "trainer.logger": []}


@pytest.fixture
def in_the_examples_folder(monkeypatch):
    monkeypatch.chdir(FIXTURES)  # the example starts `python mcp_tools/gorilla_file_system.py` from its folder


def run_scripted(agent: Agent, replies: list[str], task: dict):
    reward = load_reward("exact_match")
    config = Config.build({"data.max_prompt_length": 4000, "data.max_response_length": 1000, "rllm.agent.max_tokens_per_turn": 200})
    generator = ScriptedGenerator(replies)
    engine = EpisodeRunner(agent.to_spec(reward).validate(), generator, TOKENIZER, config, reward)
    [episode] = engine.run([task])
    return episode, generator


def test_aworlds_bfcl_example_calls_its_servers_tools_named_as_aworld_names_them(in_the_examples_folder):
    agent = bfcl.build_agent()
    assert agent.all_tools == []  # nothing is started when the Agent is built
    agent.start_servers()
    try:
        assert [tool.name for tool in agent.all_tools] == ["GorillaFileSystem__echo", "GorillaFileSystem__cat", "GorillaFileSystem__ls"]
        episode, generator = run_scripted(agent, [
            '<tool_call>{"name": "GorillaFileSystem__echo", "arguments": {"content": "AWorld", "file_name": "hello_world.py"}}</tool_call>',
            '<tool_call>{"name": "GorillaFileSystem__cat", "arguments": {"file_name": "hello_world.py"}}</tool_call>',
            '<tool_call>{"name": "GorillaFileSystem__cat", "arguments": {"file_name": "missing.py"}}</tool_call>',
            "AWorld",
        ], TASK)
    finally:
        agent.stop_servers()
    assert episode.termination_reason == TerminationReason.ENV_DONE and episode.error is None and episode.reward == 1.0
    assert '"name": "GorillaFileSystem__cat"' in generator.prompts[0] and "Show the content of a file" in generator.prompts[0]
    [shown], [missing] = (step.observation for step in episode.trajectories[0].steps[1:3])
    assert shown == {"role": "tool", "name": "GorillaFileSystem__cat", "content": "AWorld"}
    assert missing["content"].startswith("Error: GorillaFileSystem__cat raised MCPToolError: MCP tool 'cat'")
    assert not (FIXTURES / "hello_world.py").exists()  # the server wrote in its own folder, not the example's


def test_aworlds_bfcl_example_trains_and_its_server_runs_from_construction_to_the_end(in_the_examples_folder, tmp_path, sink):
    trainer = AgentTrainer(agent=bfcl.build_agent(), train_dataset=[TASK] * 2, reward_func="exact_match",
                           run_path=str(tmp_path), sinks=[sink], train_engine_name="trl", config=CONFIG)
    agent = trainer.train_processor.chat_agent
    assert agent.mcp.running and len(agent.all_tools) == 3  # started at construction: the prompt lists its tools
    assert trainer.train().steps == 1
    assert all(m.get("termination/error", 0) == 0 for m in sink.metrics)
    assert not agent.mcp.running  # stopped at the end of training
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())["agent"]["mcp_servers"]
    assert recorded == {"GorillaFileSystem": {"type": "stdio", "command": "python", "args": ["mcp_tools/gorilla_file_system.py"], "env": []}}


def escape_agent(**entry) -> Agent:
    server = {"command": "python", "args": [str(FIXTURES / "mcp_escape_server.py")], **entry}
    return Agent(name="escaper", system_prompt="", mcp_servers=["escape"], mcp_config={"mcpServers": {"escape": server}})


def call(agent: Agent, tool: str, **arguments) -> str:
    return {t.name: t for t in agent.all_tools}[f"escape__{tool}"].call(arguments)


def test_a_stdio_server_cannot_read_outside_its_jail_reach_the_network_or_see_the_trainers_environment(tmp_path, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text("the platform's key")
    monkeypatch.setenv("PLATFORM_SECRET_KEY", "s3cret")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    agent = escape_agent(env={"GIVEN": "1"})
    agent.start_servers()
    try:
        assert call(agent, "read", path=str(FIXTURES / "mcp_escape_server.py")).startswith("read: ")  # what its args name
        assert call(agent, "read", path=str(secret)).startswith("failed: FileNotFoundError")
        assert call(agent, "read", path="/etc/passwd").startswith("failed: FileNotFoundError")
        assert call(agent, "write", path=str(FIXTURES / "mcp_escape_server.py"), text="x").startswith("failed: OSError")  # read-only
        assert call(agent, "connect", host="127.0.0.1", port=listener.getsockname()[1]).startswith("failed: ConnectionRefusedError")
        assert call(agent, "connect", host="1.1.1.1", port=53).startswith("failed: OSError")  # no route out of its namespace
        whoami = call(agent, "whoami")
    finally:
        agent.stop_servers()
        listener.close()
    uid, names = whoami.split(" ")
    assert uid == "uid=65534"  # nobody (the jail's user, also inside a user namespace)
    assert "GIVEN" in names and "PLATFORM_SECRET_KEY" not in names
    assert (FIXTURES / "mcp_escape_server.py").read_text().startswith('"""An MCP server')


def test_a_server_that_fails_to_start_is_named_with_what_it_wrote_to_stderr(tmp_path):
    broken = {"command": "python", "args": ["-c", "import sys; sys.stderr.write('SEARCH_API_KEY is not set\\n'); sys.exit(3)"]}
    agent = Agent(name="searcher", mcp_servers=["search"], mcp_config={"mcpServers": {"search": broken}})
    with pytest.raises(MCPServerError) as error:
        AgentTrainer(agent=agent, train_dataset=[TASK] * 2, reward_func="exact_match", run_path=str(tmp_path),
                     train_engine_name="trl", config=CONFIG)
    message = str(error.value)
    assert message.startswith("agent 'searcher': MCP server 'search' (mcp_config): MCP server `python -c")
    assert "SEARCH_API_KEY is not set" in message
    assert not agent.mcp.running


@pytest.fixture
def loopback_mcp():
    """An HTTP server on loopback where the example's server would be: it must never be asked anything."""
    server = LoopbackServer(lambda request: Response(200, {}))
    yield server
    server.close()


@pytest.mark.parametrize("url", ["{loopback}/calculator/sse", "http://localhost:{port}/calculator/sse",
                                 "http://169.254.169.254/latest/meta-data/", "http://[::ffff:127.0.0.1]:{port}/mcp"])
@pytest.mark.parametrize("kind", ["sse", "streamable-http"])
def test_a_url_server_at_an_internal_address_is_refused_by_the_egress_guard(url, kind, loopback_mcp, tmp_path):
    port = loopback_mcp.url.rsplit(":", 1)[1]
    url = url.format(loopback=loopback_mcp.url, port=port)
    agent = Agent(name="search_agent", mcp_servers=["simple-calculator"],
                  mcp_config={"mcpServers": {"simple-calculator": {"type": kind, "url": url, "timeout": 5}}})
    with pytest.raises(MCPServerError, match=r"^agent 'search_agent': MCP server 'simple-calculator' \(mcp_config\): "
                                              r"MCP server `http.*` was not reached: refused by the egress guard: .* address"):
        AgentTrainer(agent=agent, train_dataset=[TASK] * 2, reward_func="exact_match", run_path=str(tmp_path),
                     train_engine_name="trl", config=CONFIG)
    assert loopback_mcp.calls == []


def test_aworlds_own_sse_example_is_refused_by_the_guard_not_by_the_agent(tmp_path):
    agent = calculator.build_agent()  # AWorld's example: http://127.0.0.1:8500/calculator/sse
    assert agent.describe()["mcp_servers"] == {"simple-calculator": {"type": "sse", "url": "http://127.0.0.1:8500/calculator/sse", "headers": []}}
    with pytest.raises(MCPServerError, match="127.0.0.1 is a loopback address"):
        AgentTrainer(agent=agent, train_dataset=[TASK] * 2, reward_func="exact_match", run_path=str(tmp_path),
                     train_engine_name="trl", config=CONFIG)


def test_every_connection_goes_through_the_guard_even_past_its_first_check(loopback_mcp, monkeypatch):
    monkeypatch.setattr(egress.Guard, "check_url", lambda self, url, unresolved_ok=False: None)  # the up-front check bypassed
    agent = Agent(name="a", mcp_servers=["s"], mcp_config={"mcpServers": {"s": {"type": "streamable-http", "url": loopback_mcp.url + "/mcp"}}})
    with pytest.raises(MCPServerError, match="was not reached: refused by the egress guard: 127.0.0.1 is a loopback address"):
        agent.start_servers()
    assert loopback_mcp.calls == []


@pytest.mark.parametrize("arguments, message", [
    ({"mcp_servers": ["gaia_server"], "mcp_config": {"mcpServers": {"other": {"command": "x"}}}},
     "mcp_servers names ['gaia_server'], which mcp_config['mcpServers'] does not have (it has: other)"),
    ({"mcp_servers": ["s"], "mcp_config": {"mcpServers": {"s": {"type": "function_tool"}}}},
     "type 'function_tool' is not one of stdio, sse, streamable-http (AWorld's function_tool and api servers"),
    ({"mcp_servers": ["s"], "mcp_config": {"mcpServers": {"s": {"type": "sse", "url": "ftp://x"}}}}, "a sse server needs 'url', an http(s) URL"),
    ({"mcp_servers": ["s"], "mcp_config": {"mcpServers": {"s": {"command": "python", "args": "server.py"}}}}, "'args' must be a list of strings"),
    ({"mcp_servers": ["s"], "mcp_config": {"mcpServers": {"s": {"command": "python", "sandbox": True}}}}, "unknown field(s) ['sandbox'] for a stdio server"),
    ({"mcp_servers": ["s"], "mcp_config": {"servers": {}}}, "mcp_config must be {'mcpServers': {name: entry}}"),
])
def test_an_mcp_config_not_in_aworlds_form_is_refused_naming_the_server_and_field(arguments, message):
    with pytest.raises(ValueError) as error:
        Agent(name="a", **arguments)
    assert str(error.value).startswith("agent 'a': ") and message in str(error.value)


def test_servers_mcp_servers_does_not_name_and_disabled_ones_are_not_used():
    config = {"mcpServers": {"on": {"command": "python", "args": ["-c", "pass"]}, "off": {"command": "python", "disabled": True},
                             "unnamed": {"command": "python"}}}
    agent = Agent(name="a", mcp_servers=["on", "off"], mcp_config=config)
    assert [entry.name for entry in agent.mcp.entries] == ["on"]
    assert not Agent(name="b", mcp_config=config).mcp  # as in AWorld: no mcp_servers, no server


@pytest.fixture(params=["sse", "streamable-http"])
def calculator_server(request):
    """AWorld's calculator example's server, over HTTP on a loopback port (a child process)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(FIXTURES / "mcp_calculator_server.py"), request.param, str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, process.stderr.read().decode()
                time.sleep(0.1)
        path = "/calculator/sse" if request.param == "sse" else "/mcp"
        yield request.param, port, f"http://127.0.0.1:{port}{path}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_url_server_an_administrator_allowed_is_reached_through_the_guard(calculator_server, monkeypatch):
    kind, port, url = calculator_server
    entry = {"type": kind, "url": url, "timeout": 5, "sse_read_timeout": 300}
    agent = Agent(name="search_agent", mcp_servers=["simple-calculator"], mcp_config={"mcpServers": {"simple-calculator": entry}})
    with pytest.raises(MCPServerError, match="refused by the egress guard: 127.0.0.1 is a loopback address"):
        agent.start_servers()  # not allowed: refused
    monkeypatch.setenv("EGRESS_ALLOWED_HOSTS", f"127.0.0.1:{port}")
    connections = []
    judged = egress.Guard.connect
    monkeypatch.setattr(egress.Guard, "connect", lambda self, host, port: connections.append((host, port)) or judged(self, host, port))
    agent.start_servers()
    try:
        tools = {tool.name: tool for tool in agent.all_tools}
        assert sorted(tools) == ["simple-calculator__add", "simple-calculator__divide"]
        assert tools["simple-calculator__divide"].call({"a": 30000, "b": 1.2}) == '{\n  "result": 25000.0\n}'
    finally:
        agent.stop_servers()
    assert connections and set(connections) == {("127.0.0.1", port)}  # every connection made by the guard's proxy


def test_on_verl_an_agent_with_mcp_servers_is_refused_before_any_server_starts(in_the_examples_folder, tmp_path):
    agent = bfcl.build_agent()
    with pytest.raises(ValueError, match=r"^agent 'file_sys_agent': mcp_servers: on the verl backend the agent's episodes "
                                         r"run in other processes, .* Train it on trl"):
        AgentTrainer(agent=agent, train_dataset=[TASK] * 2, reward_func="exact_match", run_path=str(tmp_path), train_engine_name="verl")
    assert agent.all_tools == [] and not agent.mcp.running


def test_where_new_programs_are_refused_the_run_check_builds_the_trainer_without_starting_servers(in_the_examples_folder, tmp_path, monkeypatch):
    import training.compat.aworld.agents as agents

    monkeypatch.setattr(agents, "refusing_programs", lambda: True)  # as in the platform's check of a run (a seccomp filter there)
    trainer = AgentTrainer(agent=bfcl.build_agent(), train_dataset=[TASK] * 2, reward_func="exact_match",
                           run_path=str(tmp_path), train_engine_name="trl", config=CONFIG)
    agent = trainer.train_processor.chat_agent
    assert not agent.mcp.running and agent.all_tools == []  # the run starts them


def test_what_is_recorded_of_a_server_holds_no_key_or_token():
    config = {"mcpServers": {
        "search": {"command": "python", "args": ["-m", "search_server"], "env": {"SEARCH_API_KEY": "sk-live-123456"}},
        "gaia_server": {"type": "streamable-http", "url": "https://user:pw@playground.example.com/environments/mcp?token=tok-987",
                        "headers": {"Authorization": "Bearer invitation-555"}, "timeout": 600, "client_session_timeout_seconds": 600},
    }}
    described = Agent(name="gaia_agent", mcp_servers=["search", "gaia_server"], mcp_config=config).describe()["mcp_servers"]
    assert described == {
        "search": {"type": "stdio", "command": "python", "args": ["-m", "search_server"], "env": ["SEARCH_API_KEY"]},
        "gaia_server": {"type": "streamable-http", "url": "https://playground.example.com/environments/mcp", "headers": ["Authorization"]},
    }
    assert not any(secret in str(described) for secret in ("sk-live", "tok-987", "invitation-555", "pw@"))


def test_a_server_whose_arguments_name_the_root_folder_is_not_started():
    agent = escape_agent(args=[str(FIXTURES / "mcp_escape_server.py"), "/"])
    with pytest.raises(MCPServerError, match=r"failed to start: ValueError: a jailed server is never shown the machine's root folder"):
        agent.start_servers()
