"""rLLM's own code trains here with only its import lines changed.

The fixtures (tests/fixtures/rllm_*.py) are rLLM v0.2.1.post1's FrozenLakeAgent and FrozenLakeEnv,
MathAgent and the solver-judge workflow example, copied with only their imports changed. Each
test trains a few steps of the tiny model on the trl backend, as rLLM's train scripts call
``AgentTrainer``, and checks that no episode failed and that the model learnt.

A randomly initialised character model never writes rLLM's answer formats (```Up```,
``<answer>1</answer>``), so every reward would be 0 and nothing could be learnt. The FrozenLake
and solver-judge tests therefore start from a tiny model warmed up for a few seconds on those
formats (``warm_tiny_model``): its answers then vary, and so do the rewards.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from training import AgentTrainer, RewardOutput, SingleTurnEnvironment
from training.config import Config
from training.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from rllm_frozenlake_agent import FrozenLakeAgent  # noqa: E402
from rllm_frozenlake_env import FrozenLakeEnv  # noqa: E402
from rllm_math_agent import MathAgent  # noqa: E402
from rllm_solver_judge_flow import Judge, SolverJudgeWorkflow  # noqa: E402
from warm_start import NO_CHECKPOINTING, warm_tiny_model  # noqa: E402

pytestmark = pytest.mark.slow


def weights(path: str | Path) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


def assert_learnt(before: str | Path, result) -> None:
    assert_weights_changed(before, result.checkpoint)


def assert_weights_changed(before: str | Path, after: str | Path) -> None:
    old, new = weights(before), weights(after)
    changed = [name for name in old if not torch.equal(old[name], new[name])]
    assert len(changed) > len(old) // 2, f"only {changed} changed"


def assert_no_failed_episodes(reported: list[dict]) -> None:
    assert reported, "no step was reported"
    for metrics in reported:
        assert metrics["error_rate"] == 0.0 and metrics["termination/timeout"] == 0.0, metrics


def base_config(model: str, steps: int, **extra) -> dict:
    return {
        "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.actor.optim.lr": 1e-2,
        "actor_rollout_ref.rollout.n": 4,
        "data.train_batch_size": 2,
        "trainer.total_training_steps": steps,
        "trainer.logger": [],
        "trainer.cpu_threads": 1,
        **NO_CHECKPOINTING,
        **extra,
    }


# -- MathAgent + SingleTurnEnvironment with env_args={"reward_fn": fn} ---------------------------------


def a_to_m_reward_fn(task_info: dict, action: str) -> RewardOutput:
    """rLLM's reward signature; 1 for an answer starting with one of a-m (about one in eight at first)."""
    correct = bool(action) and "a" <= action[0] <= "m"
    return RewardOutput(reward=float(correct), is_correct=correct)


def train_math_agent(directory: Path, seed: int = 0, extra: tuple[str, ...] = ()) -> dict:
    """rLLM's MathAgent with SingleTurnEnvironment and a reward function in env_args, 12 steps from the
    untrained tiny model (``seed`` seeds the trainer), in ``directory``: the mean reward of the first and
    the last three steps. bench/learning_seeds.py runs this recipe over many seeds; ``extra`` tries others."""
    from learning_recipes import RecordingSink, overrides, reward_rise

    questions = [{"question": q, "data_source": "math"} for q in ("1+1=", "2+2=", "3+3=", "4+4=")]
    sink = RecordingSink()
    trainer = AgentTrainer(
        agent_class=MathAgent,
        agent_args={},
        env_args={"reward_fn": a_to_m_reward_fn},
        env_class=SingleTurnEnvironment,
        config=base_config("tiny-char", 12, **{"actor_rollout_ref.rollout.n": 8, "data.max_response_length": 2,
                                               "rllm.agent.max_steps": 1, "trainer.seed": seed, **overrides(extra)}),
        train_dataset=questions,
        run_path=str(directory),
        sinks=[sink],
    )
    return reward_rise(sink, trainer.train())


def test_math_agent_with_single_turn_environment_and_a_reward_fn_in_env_args(tmp_path):
    """The recipe learns on every seed of bench/learning_seeds.py (bench/results/math_agent_seeds.json)."""
    trained = train_math_agent(tmp_path)
    result, sink = trained["result"], trained["sink"]
    assert result.steps == 12
    assert_no_failed_episodes(sink.metrics)
    assert_learnt(tmp_path / "base_model", result)
    assert trained["after"] > trained["before"] + 0.2, [m["reward"] for m in sink.metrics]
    # config.yaml records the function by its import path (a raw function made yaml raise before).
    assert f"{__name__}.a_to_m_reward_fn" in (tmp_path / "config.yaml").read_text()


# -- the solver-judge workflow with its launch script's overrides ----------------------------------------

# rLLM v0.2.1.post1 examples/solver_judge/train_solver_judge_flow.sh, its overrides verbatim.
SOLVER_JUDGE_SCRIPT = """
data.train_batch_size=64 data.max_prompt_length=2048 data.max_response_length=1024
actor_rollout_ref.model.path=Qwen/Qwen3-4B-Instruct-2507 actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean
actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768
actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.use_kl_loss=False
actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl
actor_rollout_ref.actor.entropy_coeff=0.0 actor_rollout_ref.actor.clip_ratio_low=0.2
actor_rollout_ref.actor.clip_ratio_high=0.28 actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.fsdp_config.param_offload=True actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
actor_rollout_ref.actor.ulysses_sequence_parallel_size=1 actor_rollout_ref.rollout.tensor_model_parallel_size=1
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode="async" actor_rollout_ref.rollout.enforce_eager=False
actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0
actor_rollout_ref.rollout.gpu_memory_utilization=0.8 actor_rollout_ref.rollout.n=4
actor_rollout_ref.rollout.val_kwargs.n=1 actor_rollout_ref.rollout.val_kwargs.temperature=1.0
actor_rollout_ref.rollout.val_kwargs.top_p=1.0 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.adv_estimator=grpo rllm.compact_filtering.enable=False
rllm.compact_filtering.mask_max_prompt_length_exceeded=True rllm.compact_filtering.mask_max_response_length_exceeded=True
rllm.compact_filtering.mask_max_turns_exceeded=False rllm.compact_filtering.mask_timeout=True
rllm.rejection_sample.enable=False rllm.rejection_sample.multiplier=1.0 rllm.stepwise_advantage.enable=True
rllm.stepwise_advantage.mode=per_step trainer.critic_warmup=0 trainer.logger=['console','wandb']
trainer.project_name='solver-judge-workflow' trainer.experiment_name='countdown-solver-judge'
trainer.val_before_train=True trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=1000 trainer.test_freq=10
trainer.default_hdfs_dir=null trainer.total_epochs=100 rllm.workflow.use_workflow=True +ray_init._temp_dir=/home/tianhao/tmp
""".split()
# What the trl backend cannot honour (yet): each is refused by name, never mistaken for another key.
NOT_HONOURED = {
    "actor_rollout_ref.actor.loss_agg_mode", "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high", "trainer.logger",
}


def countdown_like_reward(task: dict, solution: str) -> RewardOutput:
    correct = solution == f"<answer>{task['target']}</answer>"
    return RewardOutput(reward=float(correct), is_correct=correct)


def test_solver_judge_workflow_with_its_launch_script_trains_every_trajectory(tmp_path, sink):
    refused, script = {}, list(SOLVER_JUDGE_SCRIPT)
    while True:  # the script as it is, less each key the trl backend refuses
        try:
            Config.build(script)
            break
        except ConfigError as exc:
            refused[exc.key] = str(exc)
            script = [o for o in script if o.split("=")[0] != exc.key]
    assert set(refused) <= NOT_HONOURED, refused
    assert not any("Did you mean" in message for message in refused.values()), refused

    tasks = [{"question": f"{a}+{b}", "target": str(a + b)} for a, b in ((1, 2), (2, 2), (1, 4), (3, 3))]
    judge_prompt = Judge(None)._create_judge_prompt(tasks[0]["question"], ["<answer>3</answer>", "<answer>4</answer>"])
    pairs = [([{"role": "user", "content": f"{t['question']}. Output the final answer within <answer>...</answer>"}],
              f"<answer>{d}</answer>") for t in tasks for d in range(2, 8)]
    pairs += [([{"role": "user", "content": judge_prompt}], f"<answer>{i}</answer>") for i in (1, 2)]
    model = warm_tiny_model(tmp_path / "warm", pairs)
    tiny = [  # the tiny model on two CPU cores instead of Qwen3-4B on eight GPUs
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-2", "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "data.max_response_length=24",
        "rllm.agent.max_tokens_per_turn=24", "trainer.total_training_steps=4", "trainer.logger=[]", "trainer.cpu_threads=1",
    ]

    trainer = AgentTrainer(
        workflow_class=SolverJudgeWorkflow,
        workflow_args={"n_solutions": 2, "reward_function": countdown_like_reward},
        config=script + tiny,
        train_dataset=tasks,
        val_dataset=tasks[:2],
        run_path=str(tmp_path / "run"),
        sinks=[sink],
    )
    assert trainer.final_config.rllm.stepwise_advantage.mode == "per_step"
    result = trainer.train()
    assert result.steps == 4
    training_steps = [m for m in sink.metrics if "loss" in m]
    assert_no_failed_episodes(training_steps)
    # Every episode became three rows, two solvers and a judge, each with its own reward.
    assert all(m["rows"] == 3 * 8 for m in training_steps), [m["rows"] for m in training_steps]
    episode = sink.episodes[0]
    assert [t["name"] for t in episode["trajectories"]] == ["solver", "solver", "judge"]
    assert all(t["steps"][0]["model_output"]["completion_ids"] for t in episode["trajectories"])
    assert any(m["solver_acc"] > 0 for m in training_steps), "no solver was ever right: nothing to learn from"
    assert "val/default/reward" in sink.metrics[0] or any(k.startswith("val/") for k in sink.metrics[0])
    assert_learnt(model, result)


# -- FrozenLake: rLLM's agent and environment ---------------------------------------------------------


# The 2x2 maps of these seeds all have the goal right below the player's start: one ```Down``` wins
# at once, any other move does not.
FROZENLAKE_SEEDS = (0, 1, 2, 9)
FROZENLAKE_MOVES = ("Left", "Down", "Right", "Up")


def frozenlake_warmup_pairs(tasks: list[dict], agent_args: dict) -> list[tuple[list[dict], str]]:
    """(messages -> reply) pairs for the warm start, built by rLLM's own agent and environment:
    the agent's prompt at every state a few random walks reach, each answered with every one of
    the environment's moves in rLLM's format (```Up```). So the warmed model writes fenced moves
    but has no preference among them: which move wins is left for RL to find."""
    import random

    rng = random.Random(0)
    pairs = []
    for task in tasks:
        for _ in range(3):
            env, agent = FrozenLakeEnv(**task), FrozenLakeAgent(**agent_args)
            observation, info = env.reset(task)
            agent.update_from_env(observation, 0.0, False, info)
            for _turn in range(task["max_steps"]):
                pairs += [(list(agent.chat_completions), f"```{move}```") for move in FROZENLAKE_MOVES]
                action = agent.update_from_model(f"```{rng.choice(FROZENLAKE_MOVES)}```")
                observation, reward, done, info = env.step(action.action)
                if done:
                    break
                agent.update_from_env(observation, reward, done, info)
    return list({(repr(messages), reply): (messages, reply) for messages, reply in pairs}.values())


FROZENLAKE_STEPS = 12


def train_frozenlake(directory: Path, seed: int = 0, steps: int = FROZENLAKE_STEPS, extra: tuple[str, ...] = ()) -> dict:
    """rLLM's FrozenLakeAgent and FrozenLakeEnv on the tiny model warmed up from ``seed`` (which also
    seeds the trainer's sampling), in ``directory``: the mean reward of the first and the last three
    steps, the per-step metrics, the episodes and the result. bench/learning_seeds.py runs this same
    recipe over many seeds; ``extra`` (``key=value``) is how it tries others."""
    from learning_recipes import RecordingSink, overrides, reward_rise

    agent_args = {"max_steps": 1, "use_accumulate_history": False}
    tasks = [{"size": 2, "p": 0.8, "seed": lake, "max_steps": 1, "is_slippery": False} for lake in FROZENLAKE_SEEDS]
    model = warm_tiny_model(directory / "warm", frozenlake_warmup_pairs(tasks, agent_args), steps=200, seed=seed)
    sink = RecordingSink()
    trainer = AgentTrainer(
        agent_class=FrozenLakeAgent,
        env_class=FrozenLakeEnv,
        agent_args=agent_args,
        config=base_config(model, steps, **{
            "actor_rollout_ref.rollout.n": 8, "actor_rollout_ref.actor.optim.lr": 5e-4,
            "data.max_prompt_length": 2048, "data.max_response_length": 48,
            "rllm.agent.max_steps": 1, "rllm.agent.max_tokens_per_turn": 12, "trainer.seed": seed,
            **overrides(extra),
        }),
        train_dataset=tasks,
        run_path=str(directory / "run"),
        sinks=[sink],
    )
    return {**reward_rise(sink, trainer.train()), "model": model}


def test_frozenlake_agent_and_env_from_rllm_learn_to_reach_the_goal(tmp_path):
    """rLLM's FrozenLakeAgent and FrozenLakeEnv, unchanged but for their imports (the agent sets
    ``Step(thought=...)``, which used to kill every episode). A randomly initialised model never
    writes a fenced move, so the reward could not move: the test first warms the tiny model on the
    environment's own moves in rLLM's format, with no preference among them, then RL must raise
    the share of episodes that reach the goal. The recipe learns on every seed of
    bench/learning_seeds.py (bench/results/frozenlake_example_seeds.json)."""
    trained = train_frozenlake(tmp_path)
    result, metrics, episodes = trained["result"], trained["metrics"], trained["episodes"]
    assert result.steps == FROZENLAKE_STEPS
    assert_no_failed_episodes(metrics)
    assert_learnt(trained["model"], result)
    steps = [s for e in episodes for t in e["trajectories"] for s in t["steps"]]
    assert steps and all(s["thought"] is not None and s["observation"] for s in steps)
    assert {e["termination_reason"] for e in episodes} <= {"max_turns", "env_done", "max_response_length"}
    assert trained["after"] > trained["before"] + 0.2, [m["reward"] for m in metrics]


# -- rLLM's agent-plus-environment workflows: SingleTurnWorkflow and CumulativeWorkflow -----------------

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def own_dataset_registry(monkeypatch):
    """Datasets a test registers under rLLM's names are gone after it."""
    from training.data import DatasetRegistry

    monkeypatch.setattr(DatasetRegistry, "_splits", dict(DatasetRegistry._splits))
    return DatasetRegistry


def run_rllm_example(script: str, directory: Path, config: dict) -> tuple[Path, list[dict], list[dict]]:
    """Run an rLLM train script's ``main`` in ``directory`` (it trains into AgentTrainer's default
    ./runs); return the run's directory, its per-step metrics and its episodes."""
    import contextlib
    import json

    from training.utils import import_object

    with contextlib.chdir(directory):
        import_object(f"{FIXTURES / script}:main")({**config, "trainer.logger": ["jsonl"]})  # hydra passes a given config through
    run = directory / "runs"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"reward"' in line]
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    return run, metrics, episodes


def answer_logprob(model_path: str | Path, prompts: list[list[int]], answer: list[int]) -> float:
    """Mean log-probability of ``answer`` right after each prompt: the policy itself, read without
    sampling, so that learning is measured without the noise of a few sampled rewards."""
    model = AutoModelForCausalLM.from_pretrained(model_path)
    total = 0.0
    with torch.no_grad():
        for prompt in prompts:
            logits = model(input_ids=torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : -1]
            total += torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(answer)[:, None]).sum().item()
    return total / len(prompts)


SINGLE_TURN_QUESTIONS = ["3+4=", "2+5=", "1+6=", "9-2="]
# 8 steps at 5e-4 learn on every seed, and alike when run twice side by side; 4 steps at 3e-3 (the
# former recipe, which failed once in the suite) or 1e-3 each left a seed flat or collapsed
# (bench/results/single_turn_workflow_seeds*.json).
SINGLE_TURN_LR = 5e-4
SINGLE_TURN_STEPS = 8


def train_single_turn_workflow(directory: Path, seed: int = 0, extra: tuple[str, ...] = ()) -> dict:
    """rLLM's single-turn workflow example on the tiny model warmed up from ``seed`` to answer with a
    digit, every digit alike (``seed`` also seeds the trainer), in ``directory``: the log-probability
    of the right answer (7) before and after, the per-step metrics, the episodes and the run's folder.
    bench/learning_seeds.py runs this recipe over many seeds; ``extra`` (``key=value``) tries others."""
    from learning_recipes import overrides

    from training.data import DatasetRegistry
    from training.rendering import encode, render_messages
    from training.rollouts.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    messages = [[{"role": "user", "content": q}] for q in SINGLE_TURN_QUESTIONS]
    model = warm_tiny_model(directory / "warm", [(m, str(d)) for m in messages for d in range(10)], steps=80, seed=seed)
    DatasetRegistry.register_dataset("hendrycks_math", [{"question": q, "ground_truth": "7"} for q in SINGLE_TURN_QUESTIONS], "train")
    DatasetRegistry.register_dataset("math500", [{"question": q, "ground_truth": "7"} for q in SINGLE_TURN_QUESTIONS[:2]], "test")
    run, metrics, episodes = run_rllm_example("rllm_single_turn_workflow_hendrycks_math.py", directory, {
        "actor_rollout_ref.model.path": model, "actor_rollout_ref.actor.optim.lr": SINGLE_TURN_LR,
        "actor_rollout_ref.rollout.n": 8, "data.train_batch_size": 4, "data.max_response_length": 2,
        "rllm.agent.max_tokens_per_turn": 2, "trainer.total_training_steps": SINGLE_TURN_STEPS, "trainer.seed": seed,
        "trainer.cpu_threads": 1, **overrides(extra),
    })
    prompts = [encode(tokenizer, render_messages(tokenizer, m)) for m in messages]
    seven = encode(tokenizer, "7")
    return {"before": answer_logprob(model, prompts, seven), "after": answer_logprob(run / "final_model", prompts, seven),
            "metrics": metrics, "episodes": episodes, "model": model, "run": run}


def test_rllm_single_turn_workflow_example_trains_unchanged(tmp_path, own_dataset_registry):
    """rLLM's examples/simple_math/workflow/single_turn_workflow/train_hendrycks_math.py with only
    its imports changed: SingleTurnWorkflow with rLLM's MathAgent and SingleTurnEnvironment scored
    by math_reward_fn. The tiny model is first taught to answer with a digit, every digit alike;
    RL must then make the right one (7) likelier. The recipe learns on every seed of
    bench/learning_seeds.py (bench/results/single_turn_workflow_seeds.json)."""
    from training.rendering import encode, render_messages
    from training.rollouts.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    trained = train_single_turn_workflow(tmp_path)
    run, metrics, episodes, model = trained["run"], trained["metrics"], trained["episodes"], trained["model"]
    assert len(metrics) == SINGLE_TURN_STEPS
    assert all(m["termination/error"] == 0.0 and m["termination/timeout"] == 0.0 for m in metrics)
    assert trained["after"] > trained["before"] + 0.3, (trained["before"], trained["after"])
    assert_weights_changed(model, run / "final_model")
    for episode in episodes:  # one step: the agent's question, the model's exact tokens, the env's reward
        [trajectory] = episode["trajectories"]
        [step] = trajectory["steps"]
        assert step["chat_completions"][0] == {"role": "user", "content": episode["task"]["question"]}
        assert episode["prompt_ids"] == step["prompt_ids"] == encode(tokenizer, render_messages(tokenizer, step["chat_completions"][:1]))
        assert step["response_ids"] and len(step["logprobs"]) == len(step["response_ids"])
        assert trajectory["reward"] == step["reward"] == float(step["model_response"].strip() == "7")
        assert episode["termination_reason"] in ("env_done", "max_response_length")
        assert trajectory["info"]["num_steps"] == 1 and episode["info"]["timing"]["llm_time"] > 0
