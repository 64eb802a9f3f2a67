"""The run form teaches: every config key listed with its default, type and doc; the common settings
as fields of their own; every error of a submit shown at once, each override error with its line."""

from __future__ import annotations

import pytest

from webapp.runs.models import Run

pytestmark = pytest.mark.django_db

URL = "/runs/new/"


@pytest.fixture(autouse=True)
def no_queue(monkeypatch):
    monkeypatch.setattr(Run, "enqueue", lambda self: None)


def test_the_form_lists_every_config_key_with_default_type_and_doc(owner_client, registry):
    page = owner_client.get(URL).content.decode()
    assert 'id="config-keys"' in page and 'data-key="trainer.total_training_steps"' in page
    assert "Optimizer steps to run." in page and 'id="config-fields"' in page  # the completion's data
    assert 'name="learning_rate"' in page and 'placeholder="1e-06"' in page  # a common field, its default shown


@pytest.mark.real_check
def test_every_error_shows_at_once_each_override_with_its_line(owner_client, copy_form_data):
    data = {**copy_form_data, "reward": "", "overrides": (
        "data.train_batchsize=4\nactor_rollout_ref.actor.optim.lr=abc\ntrainer.total_training_steps=-5\ndata.max_response_length=4\n")}
    response = owner_client.post(URL, data)
    errors = response.context["form"].errors
    overrides = errors["overrides"]
    assert overrides[0].startswith("line 1: data.train_batchsize: unknown config key. Did you mean 'data.train_batch_size'?")
    assert overrides[1].startswith("line 2: actor_rollout_ref.actor.optim.lr") and "abc" in overrides[1]
    assert overrides[2].startswith("line 3: trainer.total_training_steps: must be at least 1")
    assert "reward" in errors  # the single-turn task's missing reward, in the same answer
    assert Run.objects.count() == 0


def test_a_key_valid_only_beside_another_is_not_blamed(owner_client, copy_form_data):
    data = {**copy_form_data, "overrides": ("data.train_batch_size=16\nactor_rollout_ref.actor.ppo_mini_batch_size=16\n"
                                            "trainer.total_training_steps=0\n")}
    overrides = owner_client.post(URL, data).context["form"].errors["overrides"]
    assert len(overrides) == 1 and overrides[0].startswith("line 3: trainer.total_training_steps")


def test_the_common_fields_become_overrides(owner_client, copy_form_data):
    data = {**copy_form_data, "steps": "2", "batch_size": "2", "group_size": "2", "learning_rate": "0.001",
            "overrides": "data.max_response_length=4\n"}
    response = owner_client.post(URL, data)
    run = Run.objects.get()
    assert response.status_code == 302
    assert run.config_overrides == {"data.max_response_length": 4, "trainer.total_training_steps": 2, "data.train_batch_size": 2,
                                    "actor_rollout_ref.rollout.n": 2, "actor_rollout_ref.actor.optim.lr": 0.001}


def test_a_setting_given_twice_differently_is_refused(owner_client, copy_form_data):
    data = {**copy_form_data, "steps": "5", "overrides": "trainer.total_training_steps=3\n"}
    errors = owner_client.post(URL, data).context["form"].errors
    assert "set both in 'Training steps'" in errors["overrides"][0]


def test_clone_with_one_change(owner_client, copy_form_data):
    owner_client.post(URL, copy_form_data)
    first = Run.objects.get()
    form = owner_client.get(f"{URL}?clone={first.pk}").context["form"]
    data = {name: value for name, value in form.initial.items() if value is not None}
    assert (data["steps"], data["batch_size"], data["group_size"]) == (3, 2, 2)  # in their own fields
    assert "total_training_steps" not in data["overrides"] and "max_response_length: 4" in data["overrides"]
    data["steps"] = 4
    assert owner_client.post(URL, data).status_code == 302
    second = Run.objects.exclude(pk=first.pk).get()
    assert second.config_overrides == {**first.config_overrides, "trainer.total_training_steps": 4}
    assert second.agent == first.agent and second.dataset == first.dataset and second.name == "tiny copy (copy)"


def test_each_agent_says_what_it_needs_and_offers_its_dataset(owner_client, registry):
    needs = owner_client.get(URL).context["agent_needs"]
    lake = needs[str(registry["agents"]["frozenlake"].pk)]
    assert "no reward function is needed" in lake["needs"] and lake["dataset"] == registry["datasets"]["frozenlake"].pk
    copy = needs[str(registry["agents"]["copy-task"].pk)]
    assert copy["reward"] and "prompt column" in copy["needs"]
