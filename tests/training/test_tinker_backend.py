"""The tinker backend trains through the real ``tinker`` SDK.

Stand-in: the Tinker *service* (no network here). ``standins.tinker_service`` is a loopback HTTP
server that speaks the SDK's wire format (JSON futures, protobuf forward_backward and sample
results) over a real tiny torch model. Everything on our side of the wire is real: the SDK's
ServiceClient/TrainingClient/SamplingClient, our rollout engine, datums, losses and checkpoints.
"""

import hashlib
import json
import logging
import math
from pathlib import Path

import pytest
import torch

from standins.ownership import Ownership
from standins.tinker_service import TinkerStandIn
from task_rewards import PROMPTS, starts_a_to_m
from training import AgentTrainer
from training.errors import RunSuperseded

pytestmark = pytest.mark.slow


@pytest.fixture
def service(monkeypatch):
    standin = TinkerStandIn()
    monkeypatch.setenv("TINKER_API_KEY", standin.api_key)
    yield standin
    standin.close()


def config(service, steps, **extra):
    return {
        "actor_rollout_ref.model.path": "tiny-char",
        "actor_rollout_ref.actor.optim.lr": 5e-2,
        "actor_rollout_ref.rollout.n": 8,
        "data.train_batch_size": 4,
        "data.max_response_length": 2,
        "trainer.total_training_steps": steps,
        "trainer.logger": ["jsonl"],
        "remote.base_url": service.url,
        **extra,
    }


def trainer(service, tmp_path, steps, sink=None, **kwargs):
    extra = kwargs.pop("extra", {})
    return AgentTrainer(
        train_dataset=PROMPTS, reward_func=starts_a_to_m, backend="tinker", run_path=str(tmp_path),
        config=config(service, steps, **extra), sinks=[sink] if sink else None, **kwargs,
    )


def train_recipe(directory: Path, seed: int = 0, extra: tuple[str, ...] = (), service: TinkerStandIn | None = None,
                 steps: int = 10, config: dict | None = None, **kwargs) -> dict:
    """The learning tests' recipe: ``steps`` steps from the untrained tiny model on the stand-in
    ``service`` (one of its own when None) with ``config`` added, ``seed`` seeding the trainer, in
    ``directory``: the mean reward of the first and the last three steps."""
    from learning_recipes import RecordingSink, overrides, reward_rise, stand_in

    with stand_in(service, TinkerStandIn, "TINKER_API_KEY") as service:
        sink = RecordingSink()
        built = trainer(service, directory, steps, sink, extra={"trainer.seed": seed, **(config or {}), **overrides(extra)}, **kwargs)
        return {**reward_rise(sink, built.train()), "service": service}


def train_single_conversation(directory: Path, seed: int = 0, extra: tuple[str, ...] = (), service: TinkerStandIn | None = None) -> dict:
    """Four prompts, the reward 1 for a reply that starts with a letter from a to m, 10 steps.
    bench/learning_seeds.py runs it over many seeds (bench/results/tinker_seeds.json)."""
    return train_recipe(directory, seed, extra, service)


def train_two_conversations(directory: Path, seed: int = 0, extra: tuple[str, ...] = (), service: TinkerStandIn | None = None) -> dict:
    """The same with rLLM-style episodes of two conversations, each trained with its own reward, 8 steps.
    bench/learning_seeds.py runs it over many seeds (bench/results/tinker_two_conversations_seeds.json)."""
    from task_workflows import TwoConversations

    return train_recipe(directory, seed, extra, service, steps=8, config={"rllm.agent.max_tokens_per_turn": 2},
                        workflow_class=TwoConversations)


def test_reward_rises_and_the_service_weights_change(service, tmp_path):
    trained = train_single_conversation(tmp_path, service=service)
    result, sink = trained["result"], trained["sink"]

    assert result.steps == 10 and not result.stopped
    assert result.checkpoint == f"tinker://{next(iter(service.models))}/sampler_weights/step-000010"
    before, after = service.snapshots[result.checkpoint.replace("000010", "000000")], service.snapshots[result.checkpoint]
    changed = [k for k in before.weights if not torch.equal(before.weights[k], after.weights[k])]
    assert len(changed) > len(before.weights) // 2
    rewards = [m["reward"] for m in sink.metrics]
    assert len(rewards) == 10
    assert trained["after"] > trained["before"] + 0.3, rewards
    # One forward_backward + optim_step per step, weights published for sampling every step.
    assert service.counts["forward_backward"] == service.counts["optim_step"] == 10
    assert service.counts["save_weights_for_sampler"] == 11
    assert service.counts["sample"] == 10 * 4 * 8
    for name in ("loss", "kl", "lr", "step_time", "solve_rate", "response_length"):
        assert name in sink.metrics[-1], name
    assert abs(sink.metrics[0]["kl"]) < 1e-3  # the sampler served the weights the trainer scored
    assert list(service.sessions.values())[0]["finished"] == "success"
    record = json.loads((tmp_path / "checkpoints" / "checkpoint-10" / "checkpoint.json").read_text())
    assert record["state_path"].startswith("tinker://") and record["state_path"] in service.snapshots


def test_resume_loads_the_recorded_service_checkpoint(service, tmp_path):
    first = trainer(service, tmp_path, 2, extra={"trainer.save_freq": 1}).train()
    assert first.steps == 2
    state = json.loads((tmp_path / "checkpoints" / "checkpoint-2" / "checkpoint.json").read_text())["state_path"]

    resumed = trainer(service, tmp_path, 3).train()
    assert resumed.steps == 3
    assert service.counts["load_weights"] == 1 and service.counts["create_model"] == 1
    assert state in service.snapshots
    assert service.counts["forward_backward"] == 3  # 2 + 1: the resumed run did only step 3


def test_a_failed_service_call_fails_the_run_with_its_cause(service, tmp_path):
    service.fail["forward_backward"] = 2
    with pytest.raises(RuntimeError, match=r"tinker forward_backward/optim_step at step 2 failed: RequestFailedError.*injected failure"):
        trainer(service, tmp_path, 5).train()
    assert list(service.sessions.values())[0]["finished"] == "errored"


def test_cancel_stops_after_the_step_and_ends_the_session(service, tmp_path, sink):
    result = trainer(service, tmp_path, 20, sink, should_stop=lambda: len(sink.metrics) >= 2).train()
    assert result.stopped and result.steps == 2
    assert list(service.sessions.values())[0]["finished"] == "interrupted"
    assert (tmp_path / "checkpoints" / "checkpoint-2" / "checkpoint.json").is_file()  # kept for a resume


def test_rllm_tinker_names_are_accepted(service, tmp_path):
    built = AgentTrainer(
        train_dataset=PROMPTS, reward_func=starts_a_to_m, backend="tinker", run_path=str(tmp_path),
        config=["model.name=tiny-char", "data.train_batch_size=4", "model.lora_rank=8", "training.group_size=4", "training.learning_rate=2e-5",
                f"tinker_base_url={service.url}"],
    ).final_config
    assert built.actor_rollout_ref.model.lora_rank == 8
    assert built.actor_rollout_ref.rollout.n == 4
    assert built.actor_rollout_ref.actor.optim.lr == 2e-5
    assert built.remote.base_url == service.url


def test_rllm_schedule_validation_and_agent_names_map_to_ours(service, tmp_path):
    names = ["model.name=tiny-char", "data.train_batch_size=4", "training.group_size=4", f"tinker_base_url={service.url}",
             "trainer.total_training_steps=10"]

    def build(*extra):
        return AgentTrainer(train_dataset=PROMPTS, reward_func=starts_a_to_m, backend="tinker", run_path=str(tmp_path),
                            config=names + list(extra)).final_config

    built = build("training.lr_schedule=cosine", "training.warmup_steps_ratio=0.25", "validation.group_size=3", "agent.max_steps=2")
    assert built.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    assert built.actor_rollout_ref.actor.optim.lr_warmup_steps == 2  # int(0.25 x 10 steps), as rLLM counts it
    assert built.actor_rollout_ref.rollout.val_kwargs.n == 3
    assert built.rllm.agent.max_steps == 2
    with pytest.raises(ValueError, match=r"training\.lr_schedule: linear decay is not available on the tinker backend"):
        build("training.lr_schedule=linear")
    with pytest.raises(ValueError, match=r"training\.warmup_steps_ratio: is 2 warm-up steps of 10, but .*lr_warmup_steps is 3"):
        build("training.warmup_steps_ratio=0.25", "actor_rollout_ref.actor.optim.lr_warmup_steps=3")


def test_the_learning_rate_sent_each_step_follows_warmup_then_cosine(service, tmp_path, sink):
    extra = {"actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine", "actor_rollout_ref.actor.optim.lr_warmup_steps": 2}
    result = trainer(service, tmp_path, 6, sink, extra=extra).train()
    assert result.steps == 6

    base = 5e-2  # linear warm-up from 0 over 2 steps, then half a cosine over the 4 left
    expected = [base * s / 2 for s in range(2)] + [base * 0.5 * (1 + math.cos(math.pi * (s - 2) / 4)) for s in range(2, 6)]
    assert service.learning_rates == pytest.approx(expected), service.learning_rates
    assert [m["lr"] for m in sink.metrics] == pytest.approx(expected)


def test_the_test_dataset_is_scored_through_the_service_sampler_on_schedule(service, tmp_path, sink, caplog):
    extra = {"trainer.test_freq": 5, "actor_rollout_ref.rollout.val_kwargs.n": 8,
             "actor_rollout_ref.rollout.val_kwargs.do_sample": True, "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0}
    with caplog.at_level(logging.INFO, logger="training"):
        result = trainer(service, tmp_path, 10, sink, test_dataset=PROMPTS, extra=extra).train()
    assert result.steps == 10

    validated = [m for m in sink.metrics if "val/default/reward" in m]
    assert [m["step"] for m in validated] == [0, 5, 10]  # before training, every test_freq steps, after the last
    for metrics in validated:
        assert 0.0 <= metrics["val/default/pass@1"] <= metrics["val/default/pass@8"] <= 1.0
    step_five = [m for m in sink.metrics if m["step"] == 5]
    assert len(step_five) == 1 and "reward" in step_five[0]  # one report: the step's training and validation metrics
    # Scored on the published weights: the trained policy scores higher than the starting one.
    assert validated[-1]["val/default/reward"] > validated[0]["val/default/reward"] + 0.3, validated
    assert service.counts["sample"] == 10 * 4 * 8 + 3 * len(PROMPTS) * 8
    assert "validation at step 0 (4 tasks" in caplog.text
    assert "val/default/reward" in result.metrics


def test_test_freq_without_a_test_dataset_is_refused(service, tmp_path):
    with pytest.raises(ValueError, match=r"trainer\.test_freq: scoring every 2 steps needs a test dataset"):
        trainer(service, tmp_path, 1, extra={"trainer.test_freq": 2})


def test_top_k_the_service_is_not_given_is_refused_named(service, tmp_path):
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.top_k: the tinker service's sampler is not given a top-k"):
        trainer(service, tmp_path, 1, extra={"actor_rollout_ref.rollout.top_k": 20})


def test_missing_api_key_is_named_at_construction(monkeypatch, tmp_path):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(ValueError, match="TINKER_API_KEY is not set"):
        AgentTrainer(train_dataset=PROMPTS, reward_func=starts_a_to_m, backend="tinker", run_path=str(tmp_path),
                     config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4})


def test_a_reward_that_raises_fails_the_run_naming_it_and_closes_the_session(service, tmp_path):
    def broken(task, response):
        if response:  # the construction-time probe scores an empty response
            raise KeyError("score")
        return 0.0

    with pytest.raises(RuntimeError, match=r"reward function broken raised KeyError.*row \d of train_dataset.*in step 1"):
        AgentTrainer(train_dataset=PROMPTS, reward_func=broken, backend="tinker", run_path=str(tmp_path),
                     config=config(service, 3)).train()
    assert list(service.sessions.values())[0]["finished"] == "errored"


def test_every_trajectory_of_an_episode_is_trained_with_its_own_reward(service, tmp_path):
    """Episodes of two conversations (as rLLM's solver-judge has three): each conversation is a
    Datum of its own, with the advantage of its own trajectory's reward among the same-named
    trajectories of its task; the first conversation alone used to be trained."""
    from task_workflows import datums_by_conversation

    trained = train_two_conversations(tmp_path, service=service)
    sink = trained["sink"]
    assert trained["result"].steps == 8

    assert len(service.batches) == 8
    for batch in service.batches:  # 4 tasks x 8 episodes x 2 conversations
        found = datums_by_conversation(batch, PROMPTS)
        assert len(batch) == 64 and {name: len(d) for name, d in found.items()} == {"first": 32, "second": 32}
    second = [d["advantages"] for batch in service.batches for d in datums_by_conversation(batch, PROMPTS)["second"]]
    assert any(any(a != 0 for a in advantages) for advantages in second)
    assert all(m["rows"] == 64 and m["trained_sequences"] == 64 for m in sink.metrics), sink.metrics
    # The episode's reward: both conversations', 0 to 2.
    assert trained["after"] > trained["before"] + 0.4, [m["reward"] for m in sink.metrics]


def test_rllm_lora_layer_names_reach_the_service(service, tmp_path):
    """rLLM's model.train_unembed / train_attn / train_mlp become the LoRA config the service is asked for."""
    result = trainer(service, tmp_path, 1, extra={"model.train_unembed": False, "model.train_mlp": False}).train()
    assert result.steps == 1
    [lora] = service.lora_configs
    assert (lora.get("train_unembed"), lora.get("train_attn"), lora.get("train_mlp")) == (False, True, False), lora


def test_a_superseded_run_writes_no_checkpoint_record_and_publishes_no_final_weights(service, tmp_path, sink):
    """Without an attempt (the library alone) records are written in the run's folder: ``may_write``
    (a platform's fencing token) is asked before each checkpoint record and before the final weights
    are published; once it says no, nothing more of the run is written."""
    (tmp_path / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    successor = b'{"written": "by the attempt that owns the run now"}'
    (tmp_path / "checkpoints" / "checkpoint-2" / "checkpoint.json").write_bytes(successor)
    asked = []

    def may_write():
        asked.append(len(sink.metrics))
        return len(sink.metrics) < 2  # the run was taken over during step 2

    with pytest.raises(RunSuperseded, match="Not writing the checkpoint of step 2"):
        trainer(service, tmp_path, 4, sink, may_write=may_write, extra={"trainer.save_freq": 1, "trainer.resume_mode": "disable"}).train()
    assert asked == [1, 1, 2]  # step 1's record (written, then its rotation), step 2's record
    assert (tmp_path / "checkpoints" / "checkpoint-2" / "checkpoint.json").read_bytes() == successor
    assert service.counts["save_weights"] == 1  # step 1's state only
    assert list(service.sessions.values())[0]["finished"] == "errored"

    with pytest.raises(RunSuperseded, match=r"Not writing the final weights \(step 2\)"):
        trainer(service, tmp_path / "two", 2, may_write=lambda: False).train()
    assert service.counts["save_weights_for_sampler"] == 3 + 2  # the first run: start, steps 1-2; this one: start, step 1


def test_attempts_publish_their_records_into_the_run_and_a_stale_one_changes_nothing(service, tmp_path):
    """Per-attempt folders on tinker, as on trl (test_attempt_checkpoints.py): each attempt records its
    checkpoints in ``attempts/<n>/checkpoints`` and publishes them into the run's ``checkpoints`` while
    it owns the run; the next attempt resumes from the newest published; a stale attempt (its write
    check answered before the takeover) saves in its own folder only, publishes nothing and is stopped.
    The service is the stand-in; the fence is ``standins.ownership`` (the platform's is
    tests/workers/test_publish_fence.py)."""
    ownership = Ownership(1)

    def build(attempt: int, steps: int, may_write=None):
        return trainer(service, tmp_path, steps, attempt=attempt, write_fence=ownership.fence(attempt),
                       may_write=may_write or ownership.may_write(attempt),
                       extra={"trainer.save_freq": 1, "trainer.max_checkpoints": 2})

    def train(attempt: int, steps: int, may_write=None):
        return build(attempt, steps, may_write).train()

    first = train(1, 2)
    assert first.steps == 2
    assert checkpoint_names(tmp_path / "checkpoints") == ["checkpoint-1", "checkpoint-2"]
    assert checkpoint_names(tmp_path / "attempts" / "1" / "checkpoints") == ["checkpoint-2"]  # its newest only
    assert not list(tmp_path.glob("checkpoints/step-*"))

    ownership.holder = 2  # the next attempt: it resumes from the state attempt 1 published
    state = json.loads((tmp_path / "checkpoints" / "checkpoint-2" / "checkpoint.json").read_text())["state_path"]
    second = train(2, 4)
    assert second.steps == 4 and service.counts["load_weights"] == 1 and state in service.snapshots
    assert service.counts["forward_backward"] == 4  # 2 + 2: nothing trained twice
    assert checkpoint_names(tmp_path / "checkpoints") == ["checkpoint-3", "checkpoint-4"]  # rotated by the owner
    saved = service.counts["save_weights"]

    # Attempt 1 again, built while it held the run (its config published then), stale since: its lease
    # check answered before the takeover, so it trains step 5 and saves the state on the service;
    # recording it in the run is refused, which stops it.
    ownership.holder = 1
    stale_trainer = build(1, 6, may_write=lambda: True)
    ownership.holder = 2
    finished = published(tmp_path)
    with pytest.raises(RunSuperseded, match="Not publishing the checkpoint of step 5"):
        stale_trainer.train()
    assert service.counts["save_weights"] == saved + 1
    stale = json.loads((tmp_path / "attempts" / "1" / "checkpoints" / "checkpoint-5" / "checkpoint.json").read_text())
    assert stale["step"] == 5 and stale["state_path"] in service.snapshots  # in its own folder only
    assert published(tmp_path) == finished  # not listed, nothing rotated out, no resume would read it
    assert not (tmp_path / "attempts" / "1" / "publishing" / "checkpoint-5").exists()

    ownership.holder = 3  # a later attempt resumes from what attempt 2 published, never the stale record
    third = train(3, 5)
    assert third.steps == 5 and service.counts["forward_backward"] == 4 + 1 + 1
    assert json.loads((tmp_path / "checkpoints" / "checkpoint-5" / "checkpoint.json").read_text())["state_path"] != stale["state_path"]


def checkpoint_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("checkpoint-*"))


def published(run: Path) -> dict[str, str]:
    """Every file of the run's published checkpoints, with its content's hash."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((run / "checkpoints").rglob("*")) if p.is_file()}


def stored_records(run_path, split):
    from training.tracking.episodes import read_run_folder

    return read_run_folder(run_path, split)


def test_a_run_keeps_every_episode_with_its_tokens_group_and_advantage(service, tmp_path):
    extra = {"actor_rollout_ref.rollout.n": 4, "trainer.test_freq": 2, "actor_rollout_ref.rollout.val_kwargs.n": 2}
    trainer(service, tmp_path, 2, test_dataset=PROMPTS, extra=extra).train()

    train = stored_records(tmp_path, "train")
    assert [(r["step"], r["position"]) for r in train] == [(s, p) for s in (1, 2) for p in range(16)]
    assert [r["group_position"] for r in train[:8]] == [0, 1, 2, 3] * 2
    assert len({r["group"] for r in train[:4]}) == 1 and train[0]["group"] != train[4]["group"]
    assert sorted({r["row_index"] for r in train[:16]}) == list(range(len(PROMPTS)))
    for record in train:
        assert record["reward"] in (0.0, 1.0) and record["reward_components"]["score"] == record["reward"]
        assert len(record["token_ids"]) == len(record["mask"]) == len(record["logprobs"]) == len(record["token_texts"]) > 0
        assert record["prompt_ids"] and record["advantage"] is not None
    # The group advantage: above 0 for the better episodes of a group whose rewards differ.
    mixed = [r for r in train if len({o["reward"] for o in train if o["group"] == r["group"]}) > 1]
    assert mixed and all((r["advantage"] > 0) == (r["reward"] == 1.0) for r in mixed)
    val = stored_records(tmp_path, "val")
    assert sorted({r["step"] for r in val}) == [0, 2] and len(val) == 2 * len(PROMPTS) * 2
