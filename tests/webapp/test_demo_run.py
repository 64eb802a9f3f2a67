"""The demo run `make run` queues carries the demo's recipe (examples/configs/frozenlake.yaml) through
the run form: a recipe key the form refused would leave `make run` without its demo run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import examples
from webapp.registry.seed import DEMO_SEED
from webapp.runs.management.commands.platform import Command
from webapp.runs.trainer_args import run_trainer_kwargs

pytestmark = pytest.mark.django_db


def test_the_queued_demo_run_trains_with_the_demo_recipe(registry, admin_user, no_queue):
    run = Command()._queue_demo_run(admin_user)
    assert run is not None, "the run form refused the demo recipe"
    recipe = yaml.safe_load((Path(examples.__file__).parent / "configs" / "frozenlake.yaml").read_text())["config"]
    config = run_trainer_kwargs(run, "")["config"]
    assert config["actor_rollout_ref.actor.entropy_coeff"] == recipe["actor_rollout_ref.actor.entropy_coeff"] > 0
    assert config["trainer.seed"] == DEMO_SEED  # the seed bench/demo_curve.py found to rise steadily
    for key, value in recipe.items():
        if key not in ("actor_rollout_ref.model.path", "trainer.experiment_name", "trainer.total_training_steps"):
            assert config[key] == value, key


def test_make_runs_address_and_login_come_from_settings_and_flags(settings):
    """The README's way to change `make run`'s port and login: $PLATFORM_PORT, $PLATFORM_HOST,
    $PLATFORM_DEMO_USERNAME, $PLATFORM_DEMO_PASSWORD (read by settings), or the command's flags."""
    settings.PLATFORM_HOST, settings.PLATFORM_PORT = "0.0.0.0", 8123
    settings.PLATFORM_DEMO_USERNAME, settings.PLATFORM_DEMO_PASSWORD = "ada", "s3cret"
    parser = Command().create_parser("manage.py", "platform")
    defaults = vars(parser.parse_args([]))
    assert (defaults["host"], defaults["port"], defaults["username"], defaults["password"]) == ("0.0.0.0", 8123, "ada", "s3cret")
    assert vars(parser.parse_args(["--port", "9000", "--username", "bo"]))["port"] == 9000


@pytest.mark.parametrize("name,value,message", [
    ("PLATFORM_PORT", "eighty", "PLATFORM_PORT must be a whole number, not 'eighty'."),
    ("PLATFORM_PORT", "70000", "PLATFORM_PORT must be at most 65535, not 70000."),
    ("PLATFORM_DEMO_PASSWORD", " ", "PLATFORM_DEMO_PASSWORD is set but empty"),
])
def test_a_bad_address_or_login_stops_start_up_naming_the_variable(name, value, message):
    import os
    import subprocess
    import sys

    env = {**os.environ, name: value, "DJANGO_SETTINGS_MODULE": "webapp.settings"}
    started = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert started.returncode != 0 and message in started.stderr
