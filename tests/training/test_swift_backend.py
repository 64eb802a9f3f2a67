"""The swift backend trains through ms-swift's own GRPO entry point, in its own interpreter.

Nothing is a stand-in here: a real few-step GRPO run of ms-swift on the CPU with the tiny model,
in ``.venv-swift`` (built by ``make swift-env``, which ``make test`` runs first), started from this
environment by ``AgentTrainer(backend="swift")``. Under ``make test`` the training processes fork
from the session's warm process of that interpreter (tests/platform_slots.py: ``SWIFT_WARM_PROCESS``),
as a worker's children do from its own; one test starts its training process plain.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from task_rewards import PROMPTS
from training import AgentTrainer
from training.errors import RunSuperseded
from training.backends.swift import backend as swift_backend
from training.backends.swift.backend import DEFAULT_PYTHON, environment_problem
from warm_start import NO_CHECKPOINTING

pytestmark = pytest.mark.slow
# Asked when a test is set up (a condition given as text), not at collection: every test process
# collects this file, and asking imports ms-swift in a subprocess (about 1.5 CPU-s).
needs_swift_env = pytest.mark.skipif(
    "environment_problem(DEFAULT_PYTHON) is not None", reason="no .venv-swift here; `make swift-env` builds it (make test does)"
)
REWARD = str(Path(__file__).with_name("task_rewards.py")) + ":starts_a_to_m"


@pytest.fixture
def training_processes(monkeypatch):
    """The training processes the swift backend starts (forked from the warm process, or plain)."""
    started = []

    def start(*args, **kwargs):
        started.append(real(*args, **kwargs))
        return started[-1]

    real = swift_backend._start_training_process
    monkeypatch.setattr(swift_backend, "_start_training_process", start)
    return started


def wait_for_the_warm_process(timeout_s: float = 180.0) -> str | None:
    """The address of the session's swift warm process once it listens (it imports ms-swift first), or None."""
    address = os.environ.get(swift_backend.WARM_PROCESS_ADDRESS)
    deadline = time.monotonic() + timeout_s
    while address and not Path(address).exists():
        assert time.monotonic() < deadline, f"the swift warm process did not listen at {address} within {timeout_s:g} s"
        time.sleep(0.2)
    return address


def stored_records(run_path):
    from training.tracking.episodes import read_run_folder

    return read_run_folder(run_path)


def config(steps, **extra):
    return {
        "actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.actor.optim.lr": 3e-2,
        "actor_rollout_ref.rollout.n": 8, "data.train_batch_size": 4, "data.max_response_length": 2,
        "trainer.total_training_steps": steps, "trainer.logger": ["jsonl"],
        **NO_CHECKPOINTING, **extra,
    }


def train_single_turn(directory: Path, seed: int = 0, extra: tuple[str, ...] = ()) -> dict:
    """Four prompts, the reward 1 for a reply that starts with a letter from a to m, 6 steps of ms-swift's
    GRPO from the untrained tiny model (``seed`` seeds the trainer and the model), in ``directory``: the
    first and the last step's reward. bench/learning_seeds.py runs it over many seeds
    (bench/results/swift_single_turn_seeds.json)."""
    from learning_recipes import RecordingSink, overrides, reward_rise

    sink = RecordingSink()
    result = AgentTrainer(train_dataset=PROMPTS, reward_func=REWARD, backend="swift", run_path=str(directory),
                          config=config(6, **{"trainer.seed": seed, **overrides(extra)}), sinks=[sink]).train()
    return reward_rise(sink, result, window=1)


def train_frozenlake(directory: Path, seed: int = 0, extra: tuple[str, ...] = ()) -> dict:
    """FrozenLake through ms-swift's multi-turn hook for 30 steps from the untrained tiny model (``seed``
    seeds the trainer and the model), in ``directory``: the mean reward of the first and the last ten
    steps. bench/learning_seeds.py runs it over many seeds (bench/results/swift_frozenlake_seeds.json)."""
    import examples  # noqa: F401  (registers the frozenlake dataset)
    from learning_recipes import RecordingSink, overrides, reward_rise

    config = {
        "actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.actor.optim.lr": 3e-3,
        "actor_rollout_ref.rollout.n": 8, "data.train_batch_size": 4, "data.max_response_length": 48,
        "rllm.agent.max_steps": 7, "rllm.agent.max_tokens_per_turn": 1, "trainer.total_training_steps": 30,
        "trainer.logger": [], "trainer.seed": seed, **overrides(extra),
    }
    sink = RecordingSink()
    result = AgentTrainer(agent_class="examples.frozenlake.FrozenLakeAgent", env_class="examples.frozenlake.FrozenLakeEnv",
                          train_dataset="frozenlake:train", backend="swift", run_path=str(directory), config=config,
                          sinks=[sink]).train()
    return reward_rise(sink, result, window=10)


@needs_swift_env
def test_grpo_in_its_own_environment_changes_weights_and_raises_reward(tmp_path, training_processes):
    forked = wait_for_the_warm_process() is not None
    trained = train_single_turn(tmp_path)
    result, sink = trained["result"], trained["sink"]

    # Forked from the warm process where the session has one (make test), else started plain.
    [process] = training_processes
    assert isinstance(process, swift_backend._ForkedTrainingProcess if forked else subprocess.Popen), process

    assert result.steps == 6 and not result.stopped
    before = AutoModelForCausalLM.from_pretrained(tmp_path / "base_model").state_dict()
    after = AutoModelForCausalLM.from_pretrained(result.checkpoint).state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2
    rewards = [m["reward"] for m in sink.metrics]
    assert len(rewards) == 6 and trained["after"] > trained["before"] + 0.3, rewards
    assert {"loss", "lr", "response_length", "step_time", "grad_norm"} <= set(sink.metrics[-1])
    assert sink.episodes and sink.episodes[0]["trajectories"][0]["steps"][0]["model_response"] is not None
    # The prompt the model read, not the dataset row as an observation (the episode viewer shows it).
    [turn] = sink.episodes[0]["trajectories"][0]["steps"]
    assert turn["chat_completions"] == [{"role": "user", "content": sink.episodes[0]["task"]["prompt"]}]
    assert turn["observation"] is None
    job = json.loads((tmp_path / "swift" / "job.json").read_text())
    assert job["swift_args"]["rlhf_type"] == "grpo" and job["swift_args"]["num_generations"] == 8
    assert job["swift_args"]["gradient_checkpointing"] is False
    # Every episode kept (the run folder's episode store): what ms-swift hands the reward of each sample.
    records = stored_records(tmp_path)
    assert sorted({r["step"] for r in records}) == list(range(1, 7))
    for step in range(1, 7):
        of_step = [r for r in records if r["step"] == step]
        assert sorted(r["position"] for r in of_step) == list(range(32))
        groups = {}
        for record in of_step:
            groups.setdefault(record["group"], []).append(record["group_position"])
        assert len(groups) == 4 and all(sorted(p) == list(range(8)) for p in groups.values())  # prompt_id: rollout.n each
    for record in records:
        assert record["reward"] in (0.0, 1.0) and record["reward_components"]["score"] == record["reward"]
        assert record["termination_reason"] == "env_done" and record["num_turns"] == 1
        assert record["turns"][0]["messages"] == [{"role": "user", "content": record["prompt"][0]["content"]}]
        assert 1 <= len(record["token_ids"]) <= 2 and record["mask"] == [1] * len(record["token_ids"])
        assert record["is_correct"] == (record["reward"] == 1.0)


def test_a_missing_environment_is_named_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"swift backend cannot run here: its environment /nowhere/python does not exist"):
        AgentTrainer(train_dataset=PROMPTS, reward_func=REWARD, backend="swift", run_path=str(tmp_path),
                     config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4, "trainer.python": "/nowhere/python"})


@needs_swift_env
def test_agent_and_env_train_multi_turn_through_swifts_scheduler(tmp_path):
    """FrozenLake through ms-swift's multi-turn hook: our agent and environment play each turn
    inside ms-swift's rollout, and the episode's reward is the environment's."""
    trained = train_frozenlake(tmp_path)
    result, sink = trained["result"], trained["sink"]

    assert result.steps == 30 and not result.stopped
    before = AutoModelForCausalLM.from_pretrained(tmp_path / "base_model").state_dict()
    after = AutoModelForCausalLM.from_pretrained(result.checkpoint).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # More than one turn per episode: ms-swift's own count, and the agent's recorded steps.
    assert all(1 < m["turns"] <= 7 for m in sink.metrics), [m["turns"] for m in sink.metrics]
    multi = [e for e in sink.episodes if len([s for s in e["trajectories"][0]["steps"] if s["model_response"]]) > 1]
    assert multi and multi[0]["trajectories"][0]["steps"][1]["observation"].endswith(">")
    # Each turn records the environment's answer to it: the next turn's input, where there is one.
    steps = multi[0]["trajectories"][0]["steps"]
    assert [step["next_observation"] for step in steps[:-1]] == [step["observation"] for step in steps[1:]]
    assert all(step["next_observation"].endswith(">") for step in steps if step["model_response"])
    assert {e["termination_reason"] for e in sink.episodes} <= {"env_done", "max_turns"}
    last = sink.metrics[-1]
    assert abs(last["termination/env_done"] + last["termination/max_turns"] - 1) < 1e-6 and last["termination/error"] == 0
    rewards = [m["reward"] for m in sink.metrics]
    assert trained["after"] > trained["before"] + 0.05, rewards
    job = json.loads((tmp_path / "swift" / "job.json").read_text())
    assert job["agent"]["env_class"] == "examples.frozenlake.FrozenLakeEnv" and job["swift_args"]["max_turns"] == 7


@needs_swift_env
def test_workflows_are_refused_clearly(tmp_path):
    import examples  # noqa: F401  (registers the countdown dataset)

    with pytest.raises(ValueError, match="swift backend trains single-turn tasks and agent_class/env_class pairs.*a workflow agent"):
        AgentTrainer(workflow_class="examples.countdown_workflow.CountdownWorkflow", train_dataset="countdown:train",
                     backend="swift", run_path=str(tmp_path), config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4})


@needs_swift_env
def test_env_args_the_child_cannot_receive_are_refused(tmp_path):
    import examples  # noqa: F401

    with pytest.raises(ValueError, match="env_args: the swift backend passes these to its own interpreter as JSON"):
        AgentTrainer(agent_class="examples.frozenlake.FrozenLakeAgent", env_class="examples.frozenlake.FrozenLakeEnv",
                     env_args={"reward_fn": len}, train_dataset="frozenlake:train", backend="swift", run_path=str(tmp_path),
                     config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4})


@needs_swift_env
def test_a_reward_object_the_child_cannot_import_is_refused(tmp_path):
    with pytest.raises(ValueError, match="reward_func: the swift backend trains in its own interpreter"):
        AgentTrainer(train_dataset=PROMPTS, reward_func=lambda task, response: 0.0, backend="swift",
                     run_path=str(tmp_path), config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4})


@needs_swift_env
def test_a_stopped_run_resumes_from_its_checkpoint_and_continues_counting(tmp_path, sink, training_processes, monkeypatch):
    """Stopped mid-way (the platform's cancel or a lost worker), then run again in the same run
    directory: ms-swift's resume_from_checkpoint picks up the checkpoint saved at the stop. Its
    training processes start plain (no warm process named), as on a machine without one."""
    monkeypatch.setenv(swift_backend.WARM_PROCESS_ADDRESS, "")
    saved = []
    sink.log_checkpoint = lambda step, path: saved.append((step, Path(path)))  # as the artifact store's sink takes them
    first = AgentTrainer(train_dataset=PROMPTS, reward_func=REWARD, backend="swift", run_path=str(tmp_path),
                         config=config(12), sinks=[sink], should_stop=lambda: len(sink.metrics) >= 2).train()
    assert first.stopped and 2 <= first.steps < 12
    assert Path(first.checkpoint).name == f"checkpoint-{first.steps}"
    assert saved == [(first.steps, Path(first.checkpoint))]
    stopped_at = first.steps

    resumed_sink = type(sink)()
    resumed = AgentTrainer(train_dataset=PROMPTS, reward_func=REWARD, backend="swift", run_path=str(tmp_path),
                           config=config(12), sinks=[resumed_sink]).train()
    assert resumed.steps == 12 and not resumed.stopped
    assert len(training_processes) == 2 and all(isinstance(p, subprocess.Popen) for p in training_processes)
    assert [m["step"] for m in resumed_sink.metrics] == list(range(stopped_at + 1, 13))  # continued, not restarted
    job = json.loads((tmp_path / "swift" / "job.json").read_text())
    assert job["swift_args"]["resume_from_checkpoint"] == first.checkpoint
    before = AutoModelForCausalLM.from_pretrained(first.checkpoint).state_dict()
    after = AutoModelForCausalLM.from_pretrained(resumed.checkpoint).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


@needs_swift_env
def test_a_model_that_ships_code_is_refused_unless_trusted(tmp_path):
    """ms-swift loads every model with trust_remote_code=True, so the backend looks at the files first."""
    from training.rollouts.tiny import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    settings = {"actor_rollout_ref.model.path": str(model), "data.train_batch_size": 4}

    def build(**extra):
        return AgentTrainer(train_dataset=PROMPTS, reward_func=REWARD, backend="swift", run_path=str(tmp_path / "run"),
                            config={**settings, **extra})

    build()  # plain weights and config: accepted
    (model / "modeling_custom.py").write_text("raise SystemExit('this never runs')\n")
    with pytest.raises(ValueError, match=r"ships its own code \(modeling_custom.py\).*trust_remote_code=True"):
        build()
    build(**{"actor_rollout_ref.model.trust_remote_code": True})  # an administrator's decision
    with pytest.raises(ValueError, match="not in the local model cache, so its files cannot be checked"):
        build(**{"actor_rollout_ref.model.path": "someone/not-cached-here"})


@needs_swift_env
def test_settings_swift_would_ignore_are_refused(tmp_path):
    base = {"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4}
    for key, value, message in [("trainer.test_freq", 2, "does not score a test dataset"),
                                ("actor_rollout_ref.model.tokenizer_path", "other/tokenizer", "loads the tokenizer from the model's own directory")]:
        with pytest.raises(ValueError, match=f"{key}: .*{message}"):
            AgentTrainer(train_dataset=PROMPTS, reward_func=REWARD, backend="swift", run_path=str(tmp_path),
                         config={**base, key: value})
    import examples  # noqa: F401  (registers the frozenlake dataset)

    for key, value, message in [("rllm.agent.retries", 1, "does not retry an episode"),
                                ("rllm.agent.overlong_filter", True, "cannot leave overlong ones out")]:
        with pytest.raises(ValueError, match=f"{key}: .*{message}"):
            AgentTrainer(agent_class="examples.frozenlake.FrozenLakeAgent", env_class="examples.frozenlake.FrozenLakeEnv",
                         train_dataset="frozenlake:train", backend="swift", run_path=str(tmp_path), config={**base, key: value})


CRACKING_LAKE = '''
from pathlib import Path

from examples.frozenlake import FrozenLakeEnv

CHECKED = Path({checked!r})


class CrackingLakeEnv(FrozenLakeEnv):
    """The ice cracks under every move of the episodes: step() raises. (The trainer's check before
    training plays one step first, which holds, so that the episodes are what fails.)"""

    @staticmethod
    def from_dict(info):
        env = FrozenLakeEnv.from_dict(info)
        env.__class__ = CrackingLakeEnv
        return env

    def step(self, action):
        if not CHECKED.exists():
            CHECKED.touch()
            return super().step(action)
        raise ValueError("the ice cracked")
'''


@needs_swift_env
def test_episodes_whose_environment_raises_fail_the_run_naming_the_error(tmp_path):
    """An environment given as a file path (as uploaded code is) that raises: the episodes end with
    an error inside ms-swift's rollout, and past trainer.max_episode_error_rate the run fails with
    the same message and traceback as on the other backends."""
    from training.errors import TooManyEpisodeErrors

    env_file = tmp_path / "cracking_lake.py"
    env_file.write_text(CRACKING_LAKE.format(checked=str(tmp_path / "checked")))
    trainer = AgentTrainer(
        agent_class="examples.frozenlake.FrozenLakeAgent", env_class=f"{env_file}:CrackingLakeEnv",
        train_dataset="frozenlake:train", backend="swift", run_path=str(tmp_path / "run"),
        config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
                "rllm.agent.max_steps": 3, "rllm.agent.max_tokens_per_turn": 1, "trainer.total_training_steps": 2,
                "trainer.max_episode_error_rate": 0.5, "trainer.logger": []},
    )
    with pytest.raises(TooManyEpisodeErrors, match=r"4 of 4 episodes in step 1 ended with an error .*ValueError: the ice cracked") as failed:
        trainer.train()
    assert 'raise ValueError("the ice cracked")' in failed.value.user_traceback
    job = json.loads((tmp_path / "run" / "swift" / "job.json").read_text())
    assert job["agent"]["env_class"] == f"{env_file}:CrackingLakeEnv"


HUNG_LAKE = '''
import time
from pathlib import Path

from examples.frozenlake import FrozenLakeEnv

RELEASE = Path({release!r})


class HungLakeEnv(FrozenLakeEnv):
    """A step that never returns (a simulator or tool that hangs) until the test releases it; after
    five minutes it gives up with an error, so a rollout that waits for it fails the run."""

    @staticmethod
    def from_dict(info):
        env = FrozenLakeEnv.from_dict(info)
        env.__class__ = HungLakeEnv
        return env

    def step(self, action):
        deadline = time.monotonic() + 300
        while not RELEASE.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the step was waited for: nothing cut it at the trajectory timeout")
            time.sleep(0.05)
        return super().step(action)
'''


@needs_swift_env
def test_the_trajectory_timeout_cuts_a_hung_environment_step_inside_swifts_rollout(tmp_path, sink):
    """rllm.agent.trajectory_timeout on swift: an environment step that hangs is cut when the episode's
    time is up (it runs in a daemon thread nobody waits for); the episode ends with ``timeout`` and
    reward 0 after its first turn (of 5 allowed), as on the other backends, and training goes on."""
    env_file = tmp_path / "hung_lake.py"
    release = tmp_path / "release"
    env_file.write_text(HUNG_LAKE.format(release=str(release)))
    try:
        result = AgentTrainer(
            agent_class="examples.frozenlake.FrozenLakeAgent", env_class=f"{env_file}:HungLakeEnv",
            train_dataset="frozenlake:train", backend="swift", run_path=str(tmp_path / "run"), sinks=[sink],
            config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
                    "rllm.agent.max_steps": 5, "rllm.agent.max_tokens_per_turn": 1, "rllm.agent.trajectory_timeout": 0.3,
                    "trainer.total_training_steps": 2, "trainer.logger": []},
        ).train()
    finally:
        release.touch()  # lets the abandoned steps' threads end

    assert result.steps == 2
    assert [m["termination/timeout"] for m in sink.metrics] == [1.0, 1.0]
    assert all(m["termination/error"] == 0 for m in sink.metrics), sink.metrics
    assert all(m["turns"] == 1 and m["reward"] == 0 for m in sink.metrics), sink.metrics
    assert sink.episodes and {e["termination_reason"] for e in sink.episodes} == {"timeout"}
    job = json.loads((tmp_path / "run" / "swift" / "job.json").read_text())
    assert job["trajectory_timeout"] == 0.3 and job["swift_args"]["max_turns"] == 5


@needs_swift_env
def test_a_superseded_run_writes_no_checkpoint_in_swifts_process(tmp_path, sink):
    """ms-swift's process asks before each checkpoint (``may_write``, a platform's fencing token,
    answered by this process): once refused it saves nothing more, stops, and nothing is reported."""
    saved, asked = [], []
    sink.log_checkpoint = lambda step, path: saved.append(step)

    def may_write():  # the run is taken over after its first checkpoint
        asked.append(1)
        return len(asked) < 2

    with pytest.raises(RunSuperseded, match="Not writing the checkpoint of step 2"):
        AgentTrainer(train_dataset=PROMPTS, reward_func=REWARD, backend="swift", run_path=str(tmp_path),
                     config=config(6, **{"trainer.save_freq": 1}), sinks=[sink], may_write=may_write).train()
    assert saved == [1] and len(asked) == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("checkpoint-*")) == ["checkpoint-1"]
    assert len(sink.metrics) <= 2  # it stopped at the refused step


@needs_swift_env
def test_attempts_publish_into_the_run_and_a_stale_one_changes_nothing(tmp_path):
    """Per-attempt folders on swift, as on trl (test_attempt_checkpoints.py): ms-swift saves in the attempt's
    own folder, the owner publishes into the run's, the next attempt resumes from the newest published, and
    a stale attempt (its write check answered before the takeover) publishes nothing and is stopped."""
    import hashlib

    from standins.ownership import Ownership

    ownership = Ownership(1)

    def build(attempt: int, steps: int, may_write=None):
        return AgentTrainer(
            train_dataset=PROMPTS, reward_func=REWARD, backend="swift", run_path=str(tmp_path),
            config=config(steps, **{"trainer.save_freq": 2, "trainer.max_checkpoints": 2}), attempt=attempt,
            write_fence=ownership.fence(attempt), may_write=may_write or (lambda: ownership.holder == attempt),
        )

    def train(attempt: int, steps: int, may_write=None):
        return build(attempt, steps, may_write).train()

    def published() -> dict[str, str]:
        return {str(p.relative_to(tmp_path)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted((tmp_path / "checkpoints").rglob("*")) if p.is_file()}

    def names(folder: Path) -> list[str]:
        return sorted(p.name for p in folder.glob("checkpoint-*"))

    first = train(1, 2)
    assert first.checkpoint == str(tmp_path / "checkpoints" / "checkpoint-2")
    assert names(tmp_path / "attempts" / "1" / "checkpoints") == ["checkpoint-2"]
    ownership.holder = 2
    second = train(2, 4)
    assert second.steps == 4 and names(tmp_path / "checkpoints") == ["checkpoint-2", "checkpoint-4"]
    assert json.loads((tmp_path / "attempts" / "2" / "swift" / "job.json").read_text())["swift_args"]["resume_from_checkpoint"] == first.checkpoint

    ownership.holder = 1  # attempt 1 again, built while it held the run (its config published then), stale since
    stale = build(1, 6, may_write=lambda: True)
    ownership.holder = 2
    finished = published()
    with pytest.raises(RunSuperseded, match="checkpoint of step 6"):
        stale.train()
    assert (tmp_path / "attempts" / "1" / "checkpoints" / "checkpoint-6").is_dir()
    assert published() == finished  # not listed, nothing rotated out
