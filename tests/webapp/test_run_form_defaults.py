"""What the run form's common fields give when left empty: the chosen agent's, model's and backend's
defaults (``default_config`` of each, the agent's winning), else the library's. The library's
learning rate (1e-6, verl's, for billion-parameter models) leaves the built-in tiny model's reward
flat, so the seeded tiny-char entry carries the rate the examples train it with, and the FrozenLake
agent what its task needs (one move a turn, room for the farthest start): a run built from the form
with every common field empty gets the settings of the recipe `make run`'s demo learns with."""

from __future__ import annotations

import pytest
import yaml
from django.core.exceptions import ValidationError

import examples
from pathlib import Path
from webapp.registry.models import Agent, Backend, Model
from webapp.registry.seed import demo_run
from webapp.runs.forms import RunForm
from webapp.runs.models import Run
from webapp.runs.trainer_args import run_trainer_kwargs

pytestmark = pytest.mark.django_db

LR = "actor_rollout_ref.actor.optim.lr"
LEARNING_KEYS = (LR, "rllm.agent.max_steps", "rllm.agent.max_tokens_per_turn", "data.max_response_length")


def _frozenlake_form(registry, owner, **fields) -> RunForm:
    data = {"agent": registry["agents"]["frozenlake"].pk, "dataset": registry["datasets"]["frozenlake"].pk,
            "backend": registry["backends"]["trl"].pk, "model": "tiny-char", "overrides": "", **fields}
    return RunForm(data, user=owner)


def test_an_empty_form_gets_the_settings_the_demo_learns_with(registry, owner):
    form = _frozenlake_form(registry, owner)
    assert form.is_valid(), form.errors
    final = form.final_config  # what the trainer resolved in the sandboxed check, as the worker will
    recipe = yaml.safe_load((Path(examples.__file__).parent / "configs" / "frozenlake.yaml").read_text())["config"]
    assert final["actor_rollout_ref"]["actor"]["optim"]["lr"] == 0.001  # not the library's 1e-6
    assert final["rllm"]["agent"]["max_steps"] == recipe["rllm.agent.max_steps"]
    assert final["rllm"]["agent"]["max_tokens_per_turn"] == recipe["rllm.agent.max_tokens_per_turn"]
    assert final["data"]["max_response_length"] == recipe["data.max_response_length"]


def test_an_empty_form_trains_as_fast_as_the_demo(registry, owner):
    """The form's FrozenLake on tiny-char ran at 3.9 s a step against the demo's 0.31 s: torch's
    default threads (all cores, fighting over a tiny model) and 8 tasks a step against the demo's 1
    thread and 4 tasks. Empty, the form now gives the demo's (bench/form_defaults.py --speed)."""
    demo = dict(line.split("=", 1) for line in demo_run()["overrides"].splitlines())
    form = _frozenlake_form(registry, owner)
    assert form.is_valid(), form.errors
    final = form.final_config
    assert final["trainer"]["cpu_threads"] == int(demo["trainer.cpu_threads"]) == 1
    assert final["data"]["train_batch_size"] == int(demo["data.train_batch_size"])
    assert final["actor_rollout_ref"]["rollout"]["n"] == int(demo["actor_rollout_ref.rollout.n"])


def test_what_a_person_types_wins_over_every_default(registry, owner, no_queue):
    form = _frozenlake_form(registry, owner, learning_rate="0.02", max_turns="3")
    assert form.is_valid(), form.errors
    config = run_trainer_kwargs(form.save(owner), "")["config"]
    assert config[LR] == 0.02 and config["rllm.agent.max_steps"] == 3 and config["rllm.agent.max_tokens_per_turn"] == 1


def test_a_model_without_defaults_gets_the_library_rate_and_a_backend_default_shows(registry, owner_client, settings, tmp_path):
    (tmp_path / "qwen").mkdir()
    settings.MODEL_ROOTS = [tmp_path]
    Model.objects.create(name="qwen", source=Model.Source.PATH, identifier=str(tmp_path / "qwen"))
    trl = registry["backends"]["trl"]
    Backend.objects.filter(pk=trl.pk).update(default_config={LR: 5e-6, "trainer.device": "cpu"})
    defaults = owner_client.get("/runs/new/").context["common_defaults"]
    assert defaults["backends"][str(trl.pk)] == {LR: 5e-6}  # only the common fields' keys
    assert defaults["models"]["qwen"] == {} and defaults["models"]["tiny-char"] == {LR: 0.001}
    assert defaults["agents"][str(registry["agents"]["frozenlake"].pk)] == {"rllm.agent.max_steps": 7, "data.train_batch_size": 4}
    page = owner_client.get("/runs/new/").content.decode()
    assert 'placeholder="1e-06"' in page  # the library's, until a choice is made (the script then shows the chosen ones)


def test_the_order_is_backend_then_model_then_agent_then_the_run(make_run, registry):
    Backend.objects.filter(name="trl").update(default_config={LR: 0.5, "rllm.agent.max_steps": 2})
    Agent.objects.filter(name="frozenlake").update(default_config={"rllm.agent.max_steps": 9})
    run = make_run(agent=Agent.objects.get(name="frozenlake"), dataset=registry["datasets"]["frozenlake"], reward=None,
                   backend=Backend.objects.get(name="trl"), config_overrides={})
    config = run_trainer_kwargs(run, "")["config"]
    assert config[LR] == 0.001 and config["rllm.agent.max_steps"] == 9
    run = Run.objects.get(pk=run.pk)
    Run.objects.filter(pk=run.pk).update(config_overrides={"rllm.agent.max_steps": 4})
    assert run_trainer_kwargs(Run.objects.get(pk=run.pk), "")["config"]["rllm.agent.max_steps"] == 4


@pytest.mark.parametrize("config, words", [
    ({"actor_rollout_ref.model.path": "/etc"}, "a model's default: actor_rollout_ref.model.path cannot be set per run"),
    ({"trainer.default_local_dir": "/tmp"}, "a model's default: trainer.default_local_dir cannot be set per run"),
    ({"actor_rollout_ref.actor.optim.lrate": 0.1}, "Did you mean"),
    ({LR: "fast"}, "fast"),
])
def test_defaults_hold_only_keys_a_run_may_set(registry, config, words):
    entry = Model.objects.get(name="tiny-char")
    entry.default_config = config
    with pytest.raises(ValidationError) as raised:
        entry.full_clean()
    assert words in str(raised.value)
