"""A fork trains from its parent's checkpoint: a parent trained by the worker on the trl backend
(the tiny model, built from a config: no download) publishes a checkpoint at every step; a fork from
step 1 starts from exactly those weights, not the base model's nor a later checkpoint's, and with that
checkpoint's optimizer state (recorded on the fork, said in its note)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from training.config import Config
from training.rollouts.models import load_policy
from webapp.dashboard.series import points_after
from webapp.runs.models import Run
from webapp.runs.trainer_args import attempt_kwargs
from workers.execute import claim, train_run

# The recorder writes from its own thread and connection: the rows must be committed.
pytestmark = pytest.mark.django_db(transaction=True)

TINY = {"data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2, "data.max_response_length": 4}


def weights(folder) -> dict[str, torch.Tensor]:
    return dict(AutoModelForCausalLM.from_pretrained(folder).state_dict())


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def test_a_fork_starts_from_the_weights_of_its_parents_checkpoint(make_run, settings, tmp_path, api_client, owner):
    settings.RUNS_DIR = tmp_path / "runs"
    parent = make_run(config_overrides={**TINY, "trainer.total_training_steps": 3, "trainer.save_freq": 1,
                                        "trainer.max_checkpoints": 0, "actor_rollout_ref.actor.optim.lr": 0.05})
    assert train_run(claim(parent.pk, "w").pk) == Run.Status.SUCCEEDED, Run.objects.get(pk=parent.pk).error
    parent.refresh_from_db()
    published = parent.folder() / "checkpoints"
    assert sorted(path.name for path in published.iterdir()) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    at_step_1 = weights(published / "checkpoint-1")
    # Training moved the weights: a fork from the wrong place would be told apart.
    assert not same(at_step_1, weights(parent.folder() / "base_model"))
    assert not same(at_step_1, weights(published / "checkpoint-3"))

    # The fork goes through the API, the run's check built in the jail as for any run.
    answer = api_client(owner).post(f"/api/runs/{parent.pk}/fork/", {"step": 1, "overrides": {
        "trainer.total_training_steps": 1, "trainer.save_freq": -1,
        # A warm-up longer than the run: its one optimizer step has a learning rate of 0, so the
        # model it saves is the one it started from, tensor for tensor.
        "actor_rollout_ref.actor.optim.lr_warmup_steps": 50,
    }}, format="json")
    assert answer.status_code == 201, answer.json()
    fork = Run.objects.get(pk=answer.json()["id"])
    assert (fork.parent_id, fork.parent_step) == (parent.pk, 1)

    # What an attempt of the fork loads, as the trl backend loads it.
    kwargs = attempt_kwargs(fork, str(tmp_path / "attempt"))
    model, _, path = load_policy(Config.build(kwargs["config"]), str(tmp_path / "attempt"))
    assert path == str(published / "checkpoint-1")
    assert same(dict(model.state_dict()), at_step_1)

    # And what it trains from: the worker trains it, and its model after a step at learning rate 0
    # is the checkpoint's.
    assert train_run(claim(fork.pk, "w").pk) == Run.Status.SUCCEEDED, Run.objects.get(pk=fork.pk).error
    assert [value for _, value in points_after(fork.pk, -1)["lr"]] == [0.0]
    assert same(weights(fork.folder() / "final_model"), at_step_1)
    # With the optimizer state saved in that checkpoint, as its training reported when it began.
    fork.refresh_from_db()
    assert fork.optimizer_state == {"carried": True, "why": ""}
    assert "Optimizer state carried from step 1" in api_client(owner).get(f"/api/runs/{fork.pk}/").json()["fork_note"]
