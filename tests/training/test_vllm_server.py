"""Rollouts through a vLLM server. vLLM cannot be installed here (it needs a CUDA GPU), so the
server is a loopback stand-in speaking vLLM's OpenAI-compatible wire format (tests/standins/
vllm_server.py) and the client is the real ``openai`` library; TRL's weight push to the server
(NCCL, through the vllm package) cannot run here and is refused by name instead."""

import pytest

from standins.http import Response
from standins.vllm_server import VLLMStandIn
from training import AgentTrainer
from training.agents.spec import AgentSpec
from training.backends.trl.backend import _TRLRun
from training.config import Config
from training.rollouts.episode_runner import EpisodeRunner
from training.rollouts.tiny import build_char_tokenizer, build_tiny_model
from training.rollouts.vllm_server import VLLMServerGenerator


@pytest.fixture
def server():
    tokenizer = build_char_tokenizer()
    stand_in = VLLMStandIn(build_tiny_model(tokenizer), tokenizer)
    yield stand_in
    stand_in.close()


def test_multi_turn_episodes_generate_on_the_server_with_its_tokens_and_logprobs(server):
    import examples  # noqa: F401
    from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv, make_tasks

    tokenizer = build_char_tokenizer()
    config = Config.build({"rllm.agent.max_steps": 4, "rllm.agent.max_tokens_per_turn": 1, "data.max_response_length": 32})
    generator = VLLMServerGenerator(server.url, tokenizer, temperature=0.8, seed=3)
    spec = AgentSpec(agent_class=FrozenLakeAgent, env_class=FrozenLakeEnv).validate()
    episodes = EpisodeRunner(spec, generator, tokenizer, config).run(make_tasks(3, seed=0), n=2)

    assert len(episodes) == 6 and all(e.termination_reason.value != "error" for e in episodes)
    served = [(s["prompt_ids"], s["completion_ids"], [round(lp, 5) for lp in s["logprobs"]]) for s in server.served]
    turns = [(s.prompt_ids, s.response_ids, [round(lp, 5) for lp in s.logprobs])
             for e in episodes for t in e.trajectories for s in t.steps if s.response_ids]
    assert len(turns) == len(served) > 6
    for turn in turns:  # each turn's prompt went to the server as token ids; its tokens and log-probs came back
        assert turn in served
    assert all(r["model"] == "tiny-char" and r["temperature"] == 0.8 and r["return_token_ids"] for r in server.requests)
    assert {r["max_tokens"] for r in server.requests} == {1}


def test_a_server_that_is_not_vllm_is_named(server):
    import asyncio

    tokenizer = build_char_tokenizer()
    generator = VLLMServerGenerator(server.url, tokenizer, model="tiny-char")
    server.completions = lambda body: Response(
        body={"id": "x", "object": "text_completion", "created": 0, "model": "tiny-char",
              "choices": [{"index": 0, "text": "R", "logprobs": None, "finish_reason": "length"}]})
    with pytest.raises(RuntimeError, match="answered without token ids"):
        asyncio.run(generator.generate([5, 6], 1))


def test_the_trl_backend_asks_trl_for_server_mode_and_refuses_without_vllm(tmp_path):
    overrides = {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 1,
                 "actor_rollout_ref.rollout.server_url": "http://127.0.0.1:8000"}
    with pytest.raises(ValueError, match="actor_rollout_ref.rollout.server_url: generating on a vLLM server needs the vllm package"):
        AgentTrainer(train_dataset=[{"prompt": "x"}], reward_func=lambda task, response: 0.0, backend="trl",
                     run_path=str(tmp_path), config=overrides)
    processor_config = Config.build(overrides)
    run = _TRLRun.__new__(_TRLRun)
    run.config = processor_config
    run.processor = type("P", (), {"attempt_checkpoint_dir": lambda self: tmp_path, "attempt": None})()
    args = run.grpo_args()
    assert (args.use_vllm, args.vllm_mode, args.vllm_server_base_url) == (True, "server", "http://127.0.0.1:8000")
