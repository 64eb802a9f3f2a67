"""The fireworks backend trains through the real ``fireworks-ai[training]`` SDK.

Stand-in: Fireworks' platform (no network here). ``standins.fireworks_service`` is one loopback
HTTP server playing its control plane (trainer jobs, deployments), trainer gateway (the
Tinker-compatible trainer API), hot-load and streaming completions, in the SDK's wire formats,
over a real tiny torch model. The SDK's TrainerJobManager, DeploymentManager, WeightSyncer,
DeploymentSampler and FiretitanTrainingClient, and all of our code, are real.
"""

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from standins.fireworks_service import FireworksStandIn
from standins.ownership import Ownership
from task_rewards import PROMPTS, starts_a_to_m
from training import AgentTrainer
from training.backends.tinker_protocol.fireworks import LEDGER_FILE, ResourceLedger
from training.errors import RunSuperseded

pytestmark = pytest.mark.slow


@pytest.fixture
def platform(monkeypatch):
    standin = FireworksStandIn()
    monkeypatch.setenv("FIREWORKS_API_KEY", standin.api_key)
    yield standin
    standin.close()


def trainer(platform, tmp_path, steps, sink=None, extra=None, **kwargs):
    config = {
        "actor_rollout_ref.model.path": "tiny-char",
        "actor_rollout_ref.actor.optim.lr": 5e-2,
        "actor_rollout_ref.rollout.n": 8,
        "data.train_batch_size": 4,
        "data.max_response_length": 2,
        "trainer.total_training_steps": steps,
        "trainer.logger": ["jsonl"],
        "remote.base_url": platform.url,
        "remote.poll_interval_s": 0.05,
        **(extra or {}),
    }
    return AgentTrainer(train_dataset=PROMPTS, reward_func=starts_a_to_m, backend="fireworks", run_path=str(tmp_path),
                        config=config, sinks=[sink] if sink else None, **kwargs)


def train_recipe(directory: Path, seed: int = 0, extra: tuple[str, ...] = (), platform: FireworksStandIn | None = None,
                 steps: int = 10, config: dict | None = None, on_remote_ids=None, **kwargs) -> dict:
    """The learning tests' recipe: ``steps`` steps from the untrained tiny model on the stand-in
    ``platform`` (one of its own when None) with ``config`` added, ``seed`` seeding the trainer, in
    ``directory``: the mean reward of the first and the last three steps."""
    from learning_recipes import RecordingSink, overrides, reward_rise, stand_in

    with stand_in(platform, FireworksStandIn, "FIREWORKS_API_KEY") as platform:
        sink = RecordingSink()
        built = trainer(platform, directory, steps, sink, extra={"trainer.seed": seed, **(config or {}), **overrides(extra)}, **kwargs)
        if on_remote_ids is not None:
            built.train_processor.remote_ids_callback = on_remote_ids
        return {**reward_rise(sink, built.train()), "platform": platform}


def train_single_conversation(directory: Path, seed: int = 0, extra: tuple[str, ...] = (), platform: FireworksStandIn | None = None,
                              on_remote_ids=None) -> dict:
    """Four prompts, the reward 1 for a reply that starts with a letter from a to m, 10 steps.
    bench/learning_seeds.py runs it over many seeds (bench/results/fireworks_seeds.json)."""
    return train_recipe(directory, seed, extra, platform, on_remote_ids=on_remote_ids)


def train_two_conversations(directory: Path, seed: int = 0, extra: tuple[str, ...] = (), platform: FireworksStandIn | None = None) -> dict:
    """The same with rLLM-style episodes of two conversations, each trained with its own reward, 8 steps.
    bench/learning_seeds.py runs it over many seeds (bench/results/fireworks_two_conversations_seeds.json)."""
    from task_workflows import TwoConversations

    return train_recipe(directory, seed, extra, platform, steps=8, config={"rllm.agent.max_tokens_per_turn": 2},
                        workflow_class=TwoConversations)


def test_reward_rises_weights_hotload_each_step_and_nothing_is_left_running(platform, tmp_path):
    ids = []
    trained = train_single_conversation(tmp_path, platform=platform, on_remote_ids=ids.append)
    result = trained["result"]

    assert result.steps == 10 and not result.stopped
    assert trained["after"] > trained["before"] + 0.3, [m["reward"] for m in trained["metrics"]]
    trainer_side = platform.trainer
    first, last = (trainer_side.snapshots[trainer_side.sampler_names[name]] for name in (platform.hotloads[0], platform.hotloads[-1]))
    changed = [k for k in first.weights if not torch.equal(first.weights[k], last.weights[k])]
    assert len(changed) > len(first.weights) // 2
    assert len(platform.hotloads) == 11 and result.checkpoint == platform.hotloads[-1]  # the start, then once per step
    assert platform.completions >= 10 * 4 * 8  # every episode sampled through the deployment
    # Both paid resources were created, reported, and deleted at the end.
    assert platform.running() == []
    job, deployment = ids[-1]["fireworks_trainer_job"], ids[-1]["fireworks_deployment"]
    assert sorted(platform.deleted) == sorted([f"job:{job}", f"deployment:{deployment}"])
    record = json.loads((tmp_path / "checkpoints" / "checkpoint-10" / "checkpoint.json").read_text())
    assert record["remote_ids"] == ids[-1] and record["state_path"] in trainer_side.snapshots


def test_resume_loads_the_state_into_a_new_trainer(platform, tmp_path):
    trainer(platform, tmp_path, 2, extra={"trainer.save_freq": 1}).train()
    resumed = trainer(platform, tmp_path, 3).train()
    assert resumed.steps == 3
    assert platform.trainer.counts["load_weights"] == 1
    assert platform.trainer.counts["forward_backward"] == 3
    assert platform.running() == [] and len(platform.deleted) == 4


def test_a_failed_training_call_fails_the_run_and_tears_everything_down(platform, tmp_path):
    platform.fail["forward_backward"] = 2
    with pytest.raises(RuntimeError, match=r"fireworks forward_backward/optim_step at step 2 failed: .*injected failure"):
        trainer(platform, tmp_path, 5).train()
    assert platform.running() == [] and len(platform.deleted) == 2


def test_a_failed_sampling_call_fails_the_run_and_tears_everything_down(platform, tmp_path):
    platform.fail["completions"] = 3
    with pytest.raises(RuntimeError, match="fireworks sampling failed: .*400"):
        trainer(platform, tmp_path, 5).train()
    assert platform.running() == [] and len(platform.deleted) == 2


def test_cancel_stops_after_the_step_and_tears_everything_down(platform, tmp_path, sink):
    result = trainer(platform, tmp_path, 20, sink, should_stop=lambda: len(sink.metrics) >= 1).train()
    assert result.stopped and result.steps == 1
    assert platform.running() == [] and len(platform.deleted) == 2


KILLED_ATTEMPT = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
from task_rewards import PROMPTS, starts_a_to_m
from training import AgentTrainer
AgentTrainer(train_dataset=PROMPTS, reward_func=starts_a_to_m, backend="fireworks", run_path={run!r}, config={config!r}).train()
"""


def test_what_a_killed_attempt_left_running_is_deleted_by_the_next(platform, tmp_path):
    """A training process killed mid-run (SIGKILL, as when a worker is lost) cannot delete its job
    and deployment; the run's next attempt in the same folder deletes them before provisioning."""
    root = Path(__file__).resolve().parents[2]
    config = {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
              "data.max_response_length": 2, "trainer.total_training_steps": 1000, "trainer.logger": [],
              "remote.base_url": platform.url, "remote.poll_interval_s": 0.05}
    code = KILLED_ATTEMPT.format(root=str(root), tests=str(root / "tests" / "training"), run=str(tmp_path), config=config)
    child = subprocess.Popen([sys.executable, "-c", code], cwd=root)  # FIREWORKS_API_KEY comes from the fixture
    try:
        deadline = time.monotonic() + 300
        while not platform.hotloads and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # until the deployment serves the first weights: both resources exist
        assert platform.hotloads, f"the first attempt never got going (exit code {child.poll()})"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    left = platform.running()
    assert len(left) == 2  # a job and a deployment, billing with nobody to delete them
    assert len(json.loads((tmp_path / "fireworks_resources.json").read_text())) == 2

    result = trainer(platform, tmp_path, 1).train()
    assert result.steps == 1
    assert set(left) <= set(platform.deleted)
    assert platform.running() == []
    assert json.loads((tmp_path / "fireworks_resources.json").read_text()) == []


def test_attempts_publish_their_records_into_the_run_and_a_stale_one_changes_nothing(platform, tmp_path):
    """Per-attempt folders on fireworks, as on tinker and trl: records in ``attempts/<n>/checkpoints``,
    published into the run's ``checkpoints`` while the attempt owns the run; the next attempt resumes
    from the newest published; a stale attempt (its write check answered before the takeover)
    publishes nothing, is stopped, and still deletes its job and deployment. The fence is
    ``standins.ownership`` (the platform's: tests/workers/test_publish_fence.py)."""
    ownership = Ownership(1)

    def build(attempt: int, steps: int, may_write=None):
        return trainer(platform, tmp_path, steps, attempt=attempt, write_fence=ownership.fence(attempt),
                       may_write=may_write or ownership.may_write(attempt), extra={"trainer.save_freq": 1})

    def train(attempt: int, steps: int, may_write=None):
        return build(attempt, steps, may_write).train()

    assert train(1, 2).steps == 2
    assert names(tmp_path / "checkpoints") == ["checkpoint-1", "checkpoint-2"]
    assert names(tmp_path / "attempts" / "1" / "checkpoints") == ["checkpoint-2"]
    ownership.holder = 2
    assert train(2, 3).steps == 3
    assert platform.trainer.counts["load_weights"] == 1 and platform.trainer.counts["forward_backward"] == 3

    ownership.holder = 1  # attempt 1 again, built while it held the run (its config published then), stale since
    stale_trainer = build(1, 5, may_write=lambda: True)
    ownership.holder = 2
    finished = published(tmp_path)
    with pytest.raises(RunSuperseded, match="Not publishing the checkpoint of step 4"):
        stale_trainer.train()
    stale = json.loads((tmp_path / "attempts" / "1" / "checkpoints" / "checkpoint-4" / "checkpoint.json").read_text())
    assert stale["step"] == 4 and stale["state_path"] in platform.trainer.snapshots  # saved, in its own folder only
    assert published(tmp_path) == finished
    assert platform.running() == [] and len(platform.deleted) == 6  # each attempt's job and deployment
    assert json.loads((tmp_path / "fireworks_resources.json").read_text()) == []


def test_two_attempts_writing_the_resource_ledger_at_once_lose_no_entry(tmp_path):
    """The ledger is the one run file every attempt writes, a superseded one too (what it provisioned
    must be deleted): concurrent changes are serialized by a file lock, none is lost."""
    path = tmp_path / LEDGER_FILE
    start = threading.Barrier(2)

    def attempt(name: str) -> None:
        ledger = ResourceLedger(path)  # each its own, as two processes have
        start.wait()
        for i in range(40):
            ledger.add("job", f"{name}-{i}")
            if i % 2:
                ledger.remove("job", f"{name}-{i}")

    threads = [threading.Thread(target=attempt, args=(name,)) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(e["id"] for e in ResourceLedger(path).entries()) == sorted(
        f"{name}-{i}" for name in ("first", "second") for i in range(0, 40, 2))


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("checkpoint-*"))


def published(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((run / "checkpoints").rglob("*")) if p.is_file()}


def test_missing_api_key_is_named_at_construction(monkeypatch, tmp_path):
    monkeypatch.delenv("FIREWORKS_API_KEY", raising=False)
    with pytest.raises(ValueError, match="FIREWORKS_API_KEY is not set"):
        AgentTrainer(train_dataset=PROMPTS, reward_func=starts_a_to_m, backend="fireworks", run_path=str(tmp_path),
                     config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4})


def test_every_trajectory_of_an_episode_is_trained_with_its_own_reward(platform, tmp_path):
    """Episodes of two conversations (as rLLM's solver-judge has three): each conversation is a
    Datum of its own sent to the trainer; the first conversation alone used to be trained."""
    from task_workflows import datums_by_conversation

    trained = train_two_conversations(tmp_path, platform=platform)
    assert trained["result"].steps == 8

    batches = platform.trainer.batches
    assert len(batches) == 8
    for batch in batches:  # 4 tasks x 8 episodes x 2 conversations
        found = datums_by_conversation(batch, PROMPTS)
        assert len(batch) == 64 and {name: len(d) for name, d in found.items()} == {"first": 32, "second": 32}
    second = [d["advantages"] for batch in batches for d in datums_by_conversation(batch, PROMPTS)["second"]]
    assert any(any(a != 0 for a in advantages) for advantages in second)
    # The episode's reward: both conversations', 0 to 2.
    assert trained["after"] > trained["before"] + 0.4, [m["reward"] for m in trained["metrics"]]
    assert platform.running() == []


def test_the_learning_rate_follows_the_cosine_schedule_and_the_test_dataset_is_scored(platform, tmp_path, sink):
    extra = {"actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine", "trainer.test_freq": 3}
    assert trainer(platform, tmp_path, 3, sink, extra=extra, test_dataset=PROMPTS).train().steps == 3
    expected = [5e-2 * 0.5 * (1 + math.cos(math.pi * s / 3)) for s in range(3)]
    assert platform.trainer.learning_rates == pytest.approx(expected), platform.trainer.learning_rates
    # Greedy validation (one episode per task) through the deployment, before training and after the last step.
    assert [m["step"] for m in sink.metrics if "val/default/reward" in m] == [0, 3]
    # training episodes + validation episodes + the SDK's warm-up probe when the deployment is up and after each hot-load
    assert platform.completions == 3 * 4 * 8 + 2 * len(PROMPTS) + 1 + len(platform.hotloads)


def test_a_run_keeps_every_episode_with_its_tokens_group_and_advantage(platform, tmp_path):
    from training.tracking.episodes import read_run_folder

    trainer(platform, tmp_path, 2, extra={"actor_rollout_ref.rollout.n": 4}).train()
    train = read_run_folder(tmp_path)
    assert [(r["step"], r["position"]) for r in train] == [(s, p) for s in (1, 2) for p in range(16)]
    assert len({r["group"] for r in train[:4]}) == 1 and train[0]["group"] != train[4]["group"]
    for record in train:
        assert len(record["token_ids"]) == len(record["mask"]) == len(record["logprobs"]) == len(record["token_texts"]) > 0
        assert record["advantage"] is not None and record["reward_components"]["score"] == record["reward"]
