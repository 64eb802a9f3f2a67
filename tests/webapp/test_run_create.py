"""Creating a run in the browser: a valid form queues exactly one run; every bad input is shown
next to its field and queues nothing."""

from unittest import mock

import pytest

from webapp.registry.models import Agent, Backend, Dataset
from webapp.runs.models import Run
from workers.housekeeping import dispatch_due_runs

pytestmark = pytest.mark.real_check  # the form's check, as it runs: the path these tests are about

URL = "/runs/new/"


@pytest.fixture
def outbox(db):
    """The queued runs waiting for the workers' dispatcher (the web side sends nothing itself)."""
    return lambda: list(Run.objects.due_for_dispatch())


def post(client, data, capture):
    with capture(execute=True):
        return client.post(URL, data)


def assert_rejected(response, field, *fragments):
    assert response.status_code == 200, "an invalid form re-renders the page"
    errors = response.context["form"].errors
    assert field in errors, f"expected an error on {field!r}, got {errors.as_data()}"
    message = " ".join(errors[field])
    for fragment in fragments:
        assert fragment in message, message
    assert f'id="field-{field}"' in response.content.decode()
    assert Run.objects.count() == 0


def test_login_required(client, db):
    response = client.get(URL)
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_form_lists_the_registry(owner_client, registry):
    page = owner_client.get(URL).content.decode()
    for name in ("copy-task", "frozenlake", "char-accuracy", "trl"):
        assert name in page


def test_valid_run_is_created_and_queued_on_its_backend_queue(owner_client, owner, copy_form_data, outbox, django_capture_on_commit_callbacks):
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert run.owner == owner and run.status == Run.Status.QUEUED
    assert run.config_overrides == {"trainer.total_training_steps": 3, "data.train_batch_size": 2,
                                    "actor_rollout_ref.rollout.n": 2, "data.max_response_length": 4}
    assert outbox() == [run]
    with mock.patch("webapp.celery_app.app.send_task") as send_task:
        send_task.return_value.id = "task-1"
        assert dispatch_due_runs() == 1
    send_task.assert_called_once_with("workers.execute_run", args=[run.pk], queue="cpu")
    assert Run.objects.get().task_id == "task-1" and outbox() == []


def test_yaml_overrides_are_accepted(owner_client, copy_form_data, outbox, django_capture_on_commit_callbacks):
    copy_form_data["overrides"] = "trainer:\n  total_training_steps: 3\ndata:\n  train_batch_size: 2\n"
    post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert Run.objects.get().config_overrides == {"trainer.total_training_steps": 3, "data.train_batch_size": 2}


def test_unknown_config_key(owner_client, copy_form_data, outbox, django_capture_on_commit_callbacks):
    copy_form_data["overrides"] = "data.train_batchsize=2"
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert_rejected(response, "overrides", "data.train_batchsize", "unknown config key", "data.train_batch_size")
    assert outbox() == []


def test_wrong_type(owner_client, copy_form_data, outbox, django_capture_on_commit_callbacks):
    copy_form_data["overrides"] = "data.train_batch_size=lots"
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert_rejected(response, "overrides", "data.train_batch_size", "whole number")
    assert outbox() == []


def test_out_of_range_value(owner_client, copy_form_data, outbox, django_capture_on_commit_callbacks):
    copy_form_data["overrides"] = "actor_rollout_ref.rollout.n=0"
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert_rejected(response, "overrides", "actor_rollout_ref.rollout.n", "at least 1")
    assert outbox() == []


def test_line_that_is_not_key_value(owner_client, copy_form_data, outbox, django_capture_on_commit_callbacks):
    copy_form_data["overrides"] = "data.train_batch_size=2\njust some words"
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert_rejected(response, "overrides", "just some words", "key=value")
    assert outbox() == []


def test_missing_dataset_column(owner_client, copy_form_data, registry, outbox, django_capture_on_commit_callbacks):
    renamed = Dataset.objects.create(name="copy-renamed", identifier="copy", column_mapping={"prompt": "question"})
    copy_form_data["dataset"] = renamed.pk
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert_rejected(response, "dataset", "train_dataset", "question")
    assert outbox() == []


def test_unknown_dataset_name(owner_client, copy_form_data, outbox, django_capture_on_commit_callbacks):
    copy_form_data["dataset"] = Dataset.objects.create(name="missing", source=Dataset.Source.PATH, identifier="/nonexistent/data.jsonl").pk
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert_rejected(response, "dataset", "train_dataset", "/nonexistent/data.jsonl")
    assert outbox() == []


def test_agent_path_that_does_not_import(owner_client, copy_form_data, outbox, django_capture_on_commit_callbacks):
    broken = Agent.objects.create(name="broken", agent_class="no_such_package.agents.Agent", env_class="examples.frozenlake.FrozenLakeEnv")
    copy_form_data["agent"] = broken.pk
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert_rejected(response, "agent", "no_such_package.agents.Agent")
    assert outbox() == []


def test_reward_that_does_not_exist(owner_client, copy_form_data, registry, outbox, django_capture_on_commit_callbacks):
    from webapp.registry.models import RewardFunction

    copy_form_data["reward"] = RewardFunction.objects.create(name="nope", path="no_such_module.reward").pk
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert_rejected(response, "reward", "no_such_module")
    assert outbox() == []


def test_disabled_backend(owner_client, copy_form_data, registry, outbox, django_capture_on_commit_callbacks):
    Backend.objects.filter(name="trl").update(enabled=False)
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert_rejected(response, "backend", "disabled")
    assert outbox() == []


def test_model_set_twice(owner_client, copy_form_data, outbox, django_capture_on_commit_callbacks):
    copy_form_data["overrides"] += "actor_rollout_ref.model.path=tiny-char\n"
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert_rejected(response, "overrides", "actor_rollout_ref.model.path", "Model")
    assert outbox() == []


def test_missing_required_choice(owner_client, copy_form_data, outbox, django_capture_on_commit_callbacks):
    del copy_form_data["agent"]
    response = post(owner_client, copy_form_data, django_capture_on_commit_callbacks)
    assert_rejected(response, "agent", "required")
    assert outbox() == []
