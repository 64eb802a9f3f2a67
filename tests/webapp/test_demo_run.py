"""The demo run `make run` queues carries the demo's recipe (examples/configs/frozenlake.yaml) through
the run form: a recipe key the form refused would leave `make run` without its demo run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import examples
from webapp.runs.management.commands.platform import Command
from webapp.runs.trainer_args import run_trainer_kwargs

pytestmark = pytest.mark.django_db


def test_the_queued_demo_run_trains_with_the_demo_recipe(registry, admin_user, no_queue):
    run = Command()._queue_demo_run(admin_user)
    assert run is not None, "the run form refused the demo recipe"
    recipe = yaml.safe_load((Path(examples.__file__).parent / "configs" / "frozenlake.yaml").read_text())["config"]
    config = run_trainer_kwargs(run, "")["config"]
    assert config["actor_rollout_ref.actor.entropy_coeff"] == recipe["actor_rollout_ref.actor.entropy_coeff"] > 0
    for key, value in recipe.items():
        if key not in ("actor_rollout_ref.model.path", "trainer.experiment_name", "trainer.total_training_steps"):
            assert config[key] == value, key
