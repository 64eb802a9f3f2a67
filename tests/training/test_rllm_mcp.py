"""rLLM v0.2.1.post1's MCP example (examples/mcp) runs here with only its import lines changed, and
our MCP connection manager, environment and agent speak to a real MCP server through the real
``mcp`` client library.

What stands in for what cannot run here, and why:

- The MCP server. The example starts Tavily's web-search server (``npx -y tavily-mcp@0.2.4``:
  Node, an npm download and a paid API key). ``tests/standins/mcp_search_server.py`` is an MCP
  server written with the SDK's ``MCPServer`` that searches six HotpotQA-style documents in memory
  and names its search tool as Tavily's, ``tavily-search``. The example's command stays ``npx``:
  the test puts an ``npx`` of its own first on ``PATH``, which starts the stand-in.
- The data. ``prepare_hotpotqa_data`` downloads HotpotQA from the hub; the ``load_dataset`` it
  imported is replaced by one returning HotpotQA-shaped splits (question, answer) about those
  documents.
- The model. The script loads Qwen3-4B's tokenizer and asks a vLLM server on localhost:30000. The
  ``AutoTokenizer`` it imported gives the tiny model's tokenizer, and the ``AgentExecutionEngine`` it
  imported is ours with the base URL replaced by a scripted OpenAI-compatible server on loopback,
  which searches first and then answers from what the search returned (scripted, so that every
  episode calls the MCP tool).

The example only evaluates. Its agent and environment, with the arguments the script builds (the
tool map it read from the server, the ``npx`` command, ``search_reward_fn``), are then trained
through ``AgentTrainer`` on the tiny model (trl backend), first warmed up to answer the example's
first turn directly with one of four answers (a 2-layer character model does not learn to write a
whole ``<tool_call>`` after the tools prompt in seconds; a reply without a call is the agent's
final answer, as in rLLM). RL has to find the rewarded one: the test reads the policy's
log-probability of it before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import stat
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import datasets
import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM

import training.data
from training import AgentExecutionEngine, AgentTrainer, MCPToolAgent, SEARCH_SYSTEM_PROMPT
from training.data import DatasetRegistry
from training.compat.rllm.mcp_env import MCPConnectionManager, MCPEnvironment, MCPTool
from training.errors import MCPServerError, MCPToolError

from training.rewards import search_reward_fn
from training.rollouts.tiny import build_char_tokenizer

from standins.http import LoopbackServer, Response

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import rllm_mcp_prepare_hotpotqa_data as prepare_script  # noqa: E402
import rllm_mcp_run_tool_mcp as run_script  # noqa: E402
from test_rllm_library_agents import play  # noqa: E402
from warm_start import answer_logprob, warm_tiny_model  # noqa: E402

# -P: the stand-in's folder also holds standins/http.py, which must not shadow the standard library's http.
SERVER = [sys.executable, "-P", str(ROOT / "tests" / "standins" / "mcp_search_server.py")]


def server_children() -> list[psutil.Process]:
    """This process's descendants that are stand-in MCP servers."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any("mcp_search_server" in part for part in child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def events(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def assert_every_server_ended(log: Path) -> None:
    """Every server that started wrote its exit line (it left on its own when its stdin closed) and none is left."""
    started = [line.split()[1] for line in events(log) if line.startswith("start ")]
    ended = [line.split()[1] for line in events(log) if line.startswith("exit ")]
    assert started and sorted(started) == sorted(ended), events(log)
    assert server_children() == []


@pytest.fixture
def search_log(tmp_path) -> Path:
    return tmp_path / "mcp_search.log"


# -- the connection manager --------------------------------------------------------------------------------


def test_the_manager_lists_and_calls_the_servers_tools(search_log):
    manager = MCPConnectionManager(SERVER[0], SERVER[1:], {"MCP_SEARCH_LOG": str(search_log)})
    with manager:
        assert manager.running and len(server_children()) == 1
        # rLLM's tool map: each tool by its name, a hyphenated one also under its underscore alias.
        assert set(manager.tool_map) == {"tavily-search", "tavily_search", "lookup"}
        search = manager.tool_map["tavily_search"]
        assert isinstance(search, MCPTool) and search is manager.tool_map["tavily-search"]
        schema = search.json["function"]
        assert schema["name"] == "tavily-search" and schema["description"].startswith("Search the encyclopedia")
        assert schema["parameters"]["required"] == ["query"] and "max_results" in schema["parameters"]["properties"]

        found = manager.call_tool("tavily_search", {"query": "Oberoi hotel head office", "max_results": 1})
        assert found == "[The Oberoi Group] The Oberoi Group is a hotel company with its head office in Delhi."
        assert search.forward(query="Ed Wood filmmaker", max_results=1).to_string().startswith("[Ed Wood]")
        assert asyncio.run(search.async_forward(query="Arthur's Magazine")).output.startswith("[Arthur's Magazine]")
        answers = manager.execute_tool_calls([
            {"id": "a", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"title": "Ed Wood"})}},
            {"id": "b", "type": "function", "function": {"name": "wikipedia", "arguments": "{}"}},
            {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": "[1, 2]"}},
        ])
        assert answers["a"].startswith("Edward Davis Wood Jr.")
        assert answers["b"] == "Error: there is no tool 'wikipedia'; the tools are: tavily-search, tavily_search, lookup"
        assert answers["c"] == "Error: the arguments of a tool call must be a JSON object"
    assert not manager.running
    with pytest.raises(MCPServerError, match=r"MCP server `.*mcp_search_server.py` cannot call tool 'lookup': not running"):
        manager.call_tool("lookup", {"title": "Ed Wood"})
    assert [line.split()[0] for line in events(search_log)] == ["start", "call", "call", "call", "call", "exit"]
    assert_every_server_ended(search_log)


@pytest.mark.parametrize("command, expected", [
    (["/nonexistent/mcp-server", "--stdio"],
     r"MCP server `/nonexistent/mcp-server --stdio` failed to start: FileNotFoundError"),
    ([sys.executable, "-c", "import sys; print('TAVILY_API_KEY is not set', file=sys.stderr); sys.exit(3)"],
     r"failed to start: the server closed the connection before the MCP handshake completed .*\n"
     r"The server's stderr ended with:\nTAVILY_API_KEY is not set"),
    ([sys.executable, "-c", "import sys; sys.stdin.read()"],  # reads the handshake, never answers
     r"MCP server `.*sys.stdin.read\(\)'` did not complete the MCP handshake within 1 s"),
])
def test_a_server_that_does_not_start_is_named_and_left_behind_by_no_process(command, expected):
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    manager = MCPConnectionManager(command[0], command[1:], startup_timeout=1)
    with pytest.raises(MCPServerError, match=expected):
        manager.start()
    assert not manager.running
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children_before


def test_a_server_command_that_fails_stops_the_trainer_at_construction():
    rows = [{"question": "Is Delhi in India?", "ground_truth": "yes", "data_source": "hotpotqa"}] * 2
    with pytest.raises(ValueError, match=r"MCPServerError: MCP server `/nonexistent/tavily-mcp` failed to start"):
        AgentTrainer(agent_class=MCPToolAgent, env_class=MCPEnvironment,
                     agent_args={"tool_map": {"search": SimpleNamespace(json={"type": "function", "function": {
                         "name": "search", "description": "Search.", "parameters": {"type": "object", "properties": {}}}})}},
                     env_args={"mcp_server_command": "/nonexistent/tavily-mcp"}, train_dataset=rows,
                     config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 2}, backend="trl")


def test_a_raising_tool_a_slow_tool_and_a_dead_server_give_named_errors(search_log):
    env = {"MCP_SEARCH_LOG": str(search_log), "SEARCH_DELAY_S": "5"}
    with MCPConnectionManager(SERVER[0], SERVER[1:], env, call_timeout=20) as manager:
        # lookup raises KeyError in the server; the SDK answers with an error result, which we name.
        with pytest.raises(MCPToolError, match=r"MCP tool 'lookup' of server `.*mcp_search_server.py` reported an error: "
                                               r"Error executing tool lookup"):
            manager.call_tool("lookup", {"title": "Atlantis"})
        started = time.monotonic()
        with pytest.raises(MCPToolError, match=r"MCP tool 'tavily-search' of server `.*` did not answer within 0.5 s"):
            manager.call_tool("tavily_search", {"query": "Delhi"}, timeout=0.5)
        assert time.monotonic() - started < 3  # the search itself takes 5 s
        assert manager.call_tool("lookup", {"title": "Ed Wood"}).startswith("Edward")  # the session outlives a timeout
        # As a Tool, a tool error is an output the model reads.
        assert manager.tool_map["lookup"].forward(title="Atlantis").error.startswith("MCP tool 'lookup' of server")

        [server] = server_children()
        server.send_signal(signal.SIGKILL)
        server.wait(5)
        with pytest.raises(MCPServerError, match=r"MCP server `.*mcp_search_server.py`: the connection closed during a call of tool 'lookup'"):
            manager.call_tool("lookup", {"title": "Ed Wood"})
        assert not manager.running
        manager.start()  # a lost server starts again
        assert manager.call_tool("lookup", {"title": "Ed Wood"}).startswith("Edward")
    assert server_children() == []


# -- the environment and the agent -------------------------------------------------------------------------


def test_an_episode_of_the_agent_and_environment_scores_a_scripted_answer(search_log):
    """Two environments share one server, the last one closed stops it; the model searches, looks
    up a title that does not exist (and reads the error), then answers; rLLM's search reward scores it."""
    task = {"question": "Were Scott Derrickson and Ed Wood of the same nationality?", "ground_truth": "yes", "data_source": "hotpotqa"}
    env_args = {"mcp_server_command": SERVER[0], "mcp_server_args": SERVER[1:], "mcp_server_env": {"MCP_SEARCH_LOG": str(search_log)}}
    env, other = MCPEnvironment.from_dict({**task, **env_args}), MCPEnvironment.from_dict({**task, **env_args})
    assert env.connections == other.connections and len(server_children()) == 1
    assert env.task == task and env.reward_fn.name == "search_reward_fn"  # rLLM's search reward when none is given

    agent = MCPToolAgent(system_prompt=SEARCH_SYSTEM_PROMPT, tool_map=env.tool_map)
    system = agent.chat_completions[0]["content"]
    assert system.startswith(SEARCH_SYSTEM_PROMPT) and system.count('"name": "tavily-search"') == 1 and '"name": "lookup"' in system
    replies = [
        '<tool_call>{"name": "tavily_search", "arguments": {"query": "Scott Derrickson Ed Wood nationality"}}</tool_call>',
        '<tool_call>{"name": "lookup", "arguments": {"title": "Scott Derickson"}}</tool_call>',
        "Both are American. \\boxed{yes}",
    ]
    (searched, *_), (looked_up, *_), (final, reward, done, info) = play(agent, env, replies)
    [search_text] = searched["tool_outputs"].values()
    assert "[Scott Derrickson] Scott Derrickson is an American director" in search_text and "[Ed Wood]" in search_text
    assert list(looked_up["tool_outputs"].values())[0].startswith("Error: MCP tool 'lookup' of server")
    tool_messages = [m for m in agent.chat_completions if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [search_text, list(looked_up["tool_outputs"].values())[0]]
    assert final == {} and done and reward == 1.0 and info["is_correct"] is True
    assert [step.reward for step in agent.trajectory.steps] == [0.0, 0.0, 1.0]

    env.close()
    assert len(server_children()) == 1  # the other environment still uses it
    other.close()
    other.close()  # closing twice releases once
    assert_every_server_ended(search_log)

    # rLLM's cleanup stops what environments left running.
    left_open = MCPEnvironment.from_dict({**task, **env_args})
    MCPEnvironment.cleanup_global_resources()
    assert server_children() == []
    with pytest.raises(MCPServerError, match="not running"):
        left_open.step([{"id": "x", "function": {"name": "lookup", "arguments": '{"title": "Ed Wood"}'}}])
    left_open.close()


ECHO_SERVER = [sys.executable, "-c", "from mcp.server.mcpserver import MCPServer\nserver = MCPServer('echo')\n"
               "@server.tool(description='Say it back.')\ndef echo(text: str) -> str:\n    return text.upper()\nserver.run('stdio')"]


def test_an_environment_with_several_servers_routes_each_call_and_refuses_a_tool_offered_twice(search_log):
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    search = {"command": SERVER[0], "args": SERVER[1:], "env": {"MCP_SEARCH_LOG": str(search_log)}}
    echo = {"command": ECHO_SERVER[0], "args": ECHO_SERVER[1:]}
    env = MCPEnvironment(task={"question": "q", "ground_truth": "yes"}, mcp_servers={"search": search, "echo": echo})
    assert set(env.tool_map) == {"tavily-search", "tavily_search", "lookup", "echo"} and len(env.connections) == 2
    observation, _, done, _ = env.step([
        {"id": "1", "function": {"name": "echo", "arguments": '{"text": "delhi"}'}},
        {"id": "2", "function": {"name": "lookup", "arguments": '{"title": "The Oberoi Group"}'}},
    ])
    assert not done and observation["tool_outputs"] == {"1": "DELHI", "2": "The Oberoi Group is a hotel company with its head office in Delhi."}
    env.close()

    twice = {"search": search, "search again": {**search, "env": {"MCP_SEARCH_LOG": str(search_log), "SEARCH_DELAY_S": "0"}}}
    with pytest.raises(ValueError, match=r"MCP tool 'tavily-search' is offered by two servers, `.*mcp_search_server.py` and `.*`"):
        MCPEnvironment(task={}, mcp_servers=twice)
    with pytest.raises(ValueError, match=r"mcp_servers\['echo'\] must be \{'command': str"):
        MCPEnvironment(task={}, mcp_servers={"echo": {"cmd": "echo"}})
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children_before  # the echo server too


# -- rLLM's examples/mcp -----------------------------------------------------------------------------------

# HotpotQA-shaped rows about the stand-in's documents: the training split's answers are all "yes",
# the validation split's (the script evaluates on it) mixed.
HOTPOTQA = {
    "train": [
        ("Were Scott Derrickson and Ed Wood of the same nationality?", "yes"),
        ("Are Arthur's Magazine and First for Women both American publications?", "yes"),
        ("Did Shirley Temple play Corliss Archer?", "yes"),
        ("Is The Oberoi Group a hotel company?", "yes"),
    ],
    "validation": [
        ("The Oberoi family is part of a hotel company that has a head office in what city?", "Delhi"),
        ("What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?", "Chief of Protocol"),
        ("Which magazine was started first, Arthur's Magazine or First for Women?", "Arthur's Magazine"),
    ],
}
# What the scripted model answers after reading the search results, by the first document found.
ANSWER_BY_DOCUMENT = {"The Oberoi Group": "Delhi", "Shirley Temple": "Chief of Protocol", "Arthur's Magazine": "Arthur's Magazine",
                      "First for Women": "First for Women", "Scott Derrickson": "yes", "Ed Wood": "yes"}


def hotpotqa_from_the_hub(path: str, name: str, **kwargs) -> datasets.DatasetDict:
    """Stands in for ``datasets.load_dataset("hotpotqa/hotpot_qa", "distractor")`` (a download)."""
    hotpotqa_from_the_hub.asked.append((path, name, kwargs))
    return datasets.DatasetDict({
        split: datasets.Dataset.from_list([{"id": f"{split}-{i}", "question": q, "answer": a, "type": "bridge", "level": "easy"}
                                           for i, (q, a) in enumerate(rows)])
        for split, rows in HOTPOTQA.items()
    })


class ScriptedModelServer:
    """An OpenAI-compatible chat server on loopback: to a question it answers with a call of the
    search tool (by rLLM's underscore alias), to search results with ``\\boxed{...}`` of what the
    first document found says."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.replies: list[str] = []
        self.server = LoopbackServer(self.handle)

    def handle(self, request) -> Response:
        if request.path.endswith("/models"):
            return Response(body={"object": "list", "data": [{"id": "scripted", "object": "model", "created": 0, "owned_by": "test"}]})
        body = request.json()
        self.requests.append(body)
        last = body["messages"][-1]
        if last["role"] == "tool":
            first = re.match(r"\[(.+?)\]", last["content"])
            reply = f"\\boxed{{{ANSWER_BY_DOCUMENT.get(first.group(1), 'unknown') if first else 'unknown'}}}"
        else:
            reply = '<tool_call>{"name": "tavily_search", "arguments": {"query": %s}}</tool_call>' % json.dumps(last["content"])
        self.replies.append(reply)
        return Response(body={
            "id": f"chatcmpl-{len(self.replies)}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": len(reply), "total_tokens": 1 + len(reply)},
        })


@contextlib.contextmanager
def example_run_in(work: Path):
    """rLLM's ``run_tool_mcp.py`` run in ``work`` as ``python run_tool_mcp.py <tavily_api_key>`` would run
    it, with the stand-ins above; its state (PATH with our ``npx``, the dataset registry) stays until the
    context ends."""
    work.mkdir(parents=True, exist_ok=True)
    log = work / "mcp_search.log"
    bin_dir = work / "bin"
    bin_dir.mkdir()
    npx = bin_dir / "npx"  # what `npx -y tavily-mcp@0.2.4` starts here: the stand-in (npx's arguments ignored)
    npx.write_text(f"#!/bin/sh\nMCP_SEARCH_LOG={log} exec {' '.join(SERVER)}\n")
    npx.chmod(npx.stat().st_mode | stat.S_IXUSR)
    model_server = ScriptedModelServer()
    engines: list[dict] = []
    tokenizers: list[str] = []

    class ExampleEngine(AgentExecutionEngine):
        """Our engine, asking the scripted server instead of localhost:30000; records what the script built."""

        def __init__(self, **kwargs):
            engines.append(kwargs)
            super().__init__(**{**kwargs, "rollout_engine_args": {**kwargs["rollout_engine_args"], "base_url": model_server.server.url + "/v1"}})

    class TinyTokenizer:
        @staticmethod
        def from_pretrained(name: str):
            tokenizers.append(name)
            return build_char_tokenizer()

    hotpotqa_from_the_hub.asked = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        patch.setattr(sys, "argv", ["run_tool_mcp.py", "tvly-test-key"])
        patch.setenv("TAVILY_API_KEY", "")  # the script sets both; restored after the module
        patch.setenv("TOKENIZERS_PARALLELISM", "false")
        patch.setattr(run_script, "AutoTokenizer", TinyTokenizer)
        patch.setattr(run_script, "AgentExecutionEngine", ExampleEngine)
        patch.setattr(prepare_script, "load_dataset", hotpotqa_from_the_hub)
        # The registry without a hotpotqa dataset (so the script prepares it), restored afterwards.
        patch.setattr(DatasetRegistry, "_splits", {k: v for k, v in DatasetRegistry._splits.items() if k != "hotpotqa"})
        patch.setattr(training.data, "_BUILDERS", {k: v for k, v in training.data._BUILDERS.items() if k != "hotpotqa"})
        patch.setattr(training.data, "_BUILT", {k: v for k, v in training.data._BUILT.items() if k != "hotpotqa"})
        patch.chdir(work)
        try:
            # rLLM's README runs the example once; its main() then prepares the data itself, but calls
            # .get_data() on the lists prepare_hotpotqa_data() returns (an AttributeError in rLLM too).
            # So, as rLLM's users do, the prepare script runs first (what its __main__ block does),
            # and the example finds the registered split.
            prepare_script.prepare_hotpotqa_data()
            asyncio.run(run_script.main())
            children_after_script = server_children()
            yield SimpleNamespace(work=work, log=log, engine=engines[-1], tokenizers=tokenizers, model_server=model_server,
                                  children_after_script=children_after_script, events_after_script=events(log))
        finally:
            model_server.server.close()
            MCPEnvironment.cleanup_global_resources()


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    """The example's run, kept until the module's tests are done."""
    with example_run_in(tmp_path_factory.mktemp("mcp_example")) as run:
        yield run


def test_run_tool_mcp_example_evaluates_through_the_mcp_server(example_run):
    run = example_run
    assert run.tokenizers == ["Qwen/Qwen3-4B"]
    assert hotpotqa_from_the_hub.asked == [("hotpotqa/hotpot_qa", "distractor", {"trust_remote_code": True})]
    assert run.engine["agent_class"] is MCPToolAgent and run.engine["env_class"] is MCPEnvironment
    assert run.engine["env_args"]["mcp_server_command"] == "npx" and run.engine["env_args"]["reward_fn"] is search_reward_fn
    assert set(run.engine["agent_args"]["tool_map"]) == {"tavily-search", "tavily_search", "lookup"}  # read from the server

    results = torch.load(run.work / "trajectories" / "mcp_tavily" / "trajectories.pt", weights_only=False)
    tasks = [{"question": q, "ground_truth": a, "data_source": "hotpotqa"} for q, a in HOTPOTQA["validation"]]
    assert [r.task for r in results] == tasks
    for task, trajectory in zip(tasks, results):
        searched, answered = trajectory.steps  # one search, then the answer
        [call] = searched.action
        assert call["function"]["name"] == "tavily_search" and json.loads(call["function"]["arguments"]) == {"query": task["question"]}
        [tool_message] = [m for m in answered.chat_completions if m["role"] == "tool"]
        assert tool_message["tool_call_id"] == call["id"] and tool_message["content"].startswith("[")  # the server's documents
        assert trajectory.info["termination_reason"] == "ENV_DONE"
        assert trajectory.reward == search_reward_fn(task, answered.model_response).reward
    # The search ranks First for Women above Arthur's Magazine for the third question (more shared
    # words), so the scripted model answers it wrong.
    assert [r.reward for r in results] == [1.0, 1.0, 0.0]
    # Every model call went to the scripted server, with the example's sampling and its tools prompt.
    assert len(run.model_server.requests) == 2 * len(tasks)
    assert all(r["model"] == "Qwen/Qwen3-4B" and r["temperature"] == 0.6 for r in run.model_server.requests)
    assert '"name": "tavily-search"' in run.model_server.requests[0]["messages"][0]["content"]
    # The script's own server (to read the tools) and the environments' shared one both ended.
    calls = [line for line in run.events_after_script if line.startswith("call ")]
    assert sorted(calls) == sorted(f"call tavily-search {q}" for q, _ in HOTPOTQA["validation"])
    assert sum(line.startswith("start ") for line in run.events_after_script) == 2
    assert run.children_after_script == []


def first_turn(agent_args: dict, task: dict) -> list[dict]:
    agent = MCPToolAgent(**agent_args)
    agent.update_from_env(task, 0.0, False, {})
    return [dict(m) for m in agent.chat_completions]


def train_example(directory: Path, seed: int = 0, extra: tuple[str, ...] = (), example_run=None) -> dict:
    """The example's agent, environment and MCP server trained on TRL for 3 steps at lr 5e-4 in
    ``directory`` from the tiny model warmed up to answer "\\boxed{yes}" or "\\boxed{no}" alike (``seed``
    seeds the warm start and the trainer), on the example's run (``example_run``; one of its own when
    None): the log-probability of the rewarded answer before and after. bench/learning_seeds.py runs it
    over many seeds (bench/results/mcp_example_seeds.json): every seed rises by 0.17-0.32. The former
    recipe (four answers, lr 1e-3) learnt on 7 of 10: with "yes" sampled rarely, seed 0 drew no reward in
    its three steps, and Adam's first steps at 1e-3 broke seed 2's replies (-2.26 -> -14.66)."""
    from learning_recipes import overrides

    if example_run is None:
        with example_run_in(directory / "example") as run:
            return train_example(directory, seed, extra, run)
    engine = example_run.engine
    train = DatasetRegistry.load_dataset("hotpotqa", "train")  # registered by the script's prepare_hotpotqa_data
    rows = train.get_data()
    prompts = [first_turn(engine["agent_args"], row) for row in rows]
    answers = ("yes", "no")
    model = warm_tiny_model(directory / "warm", [(p, f"\\boxed{{{a}}}") for p in prompts for a in answers], steps=40, seed=seed)
    starts_before = sum(line.startswith("start ") for line in events(example_run.log))

    AgentTrainer(
        agent_class=engine["agent_class"], env_class=engine["env_class"],
        agent_args=engine["agent_args"], env_args=engine["env_args"], train_dataset=train,
        config={"actor_rollout_ref.model.path": model, "actor_rollout_ref.actor.optim.lr": 5e-4,
                "actor_rollout_ref.rollout.n": 8, "data.train_batch_size": 2, "data.max_prompt_length": 4096,
                "data.max_response_length": 16, "rllm.agent.max_tokens_per_turn": 16, "trainer.total_training_steps": 3,
                "trainer.logger": ["jsonl"], "trainer.cpu_threads": 1, "trainer.seed": seed, **overrides(extra)},
        backend="trl", run_path=str(directory / "runs"),
    ).train()
    run = directory / "runs"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    before, after = (answer_logprob(AutoModelForCausalLM.from_pretrained(m), prompts, "\\boxed{yes}") for m in (model, run / "final_model"))
    return {"before": before, "after": after, "metrics": [m for m in metrics if "loss" in m], "rows": rows,
            "model": model, "starts_before": starts_before}


@pytest.mark.slow
def test_the_examples_agent_and_environment_train_and_close_their_servers(example_run, tmp_path):
    trained = train_example(tmp_path, example_run=example_run)
    assert [r["ground_truth"] for r in trained["rows"]] == ["yes"] * 4
    model, starts_before = trained["model"], trained["starts_before"]

    run = tmp_path / "runs"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert len(steps) == 3 and all(m["termination/error"] == 0.0 and m["termination/timeout"] == 0.0 for m in steps), steps
    assert episodes and all(e["termination_reason"] == "env_done" for e in episodes), [e["termination_reason"] for e in episodes]
    # The example's API key (in env_args' mcp_server_env) is not written down with the run's config.
    recorded = (run / "config.yaml").read_text()
    assert "TAVILY_API_KEY: <redacted>" in recorded and "tvly-test-key" not in recorded
    # The environments started the server through the example's `npx` (once for the trainer's check
    # of the first row, then for each step's episodes, which share it) and every one of them ended.
    assert sum(line.startswith("start ") for line in events(example_run.log)) - starts_before >= 4
    assert_every_server_ended(example_run.log)

    warm, final = (AutoModelForCausalLM.from_pretrained(path) for path in (model, run / "final_model"))
    changed = [name for name, weight in warm.state_dict().items() if not torch.equal(weight, final.state_dict()[name])]
    assert len(changed) > len(warm.state_dict()) // 2
    assert trained["after"] > trained["before"] + 0.1, (trained["before"], trained["after"], [m["reward"] for m in steps])
