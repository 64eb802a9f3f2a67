"""A run's spec is resolved once, when it is submitted: every attempt trains what was validated,
whatever an administrator edits in the registry since; only a revocation (a disabled backend, a
model no longer trusted, a deleted dataset file) stops it. The run page and the API show the spec,
the registry's arguments hidden; a clone starts from it."""

from __future__ import annotations

import html
import threading

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

import training.trainer
from webapp.registry.models import Agent, Backend, Dataset, Model, RewardFunction
from webapp.runs.forms import RunForm
from webapp.runs.models import Run
from webapp.policy.checks import HIDDEN
from webapp.runs.trainer_args import Revoked, attempt_kwargs, run_spec, run_trainer_kwargs
from workers import execute, lifecycle
from workers.execute import claim, train_run

pytestmark = pytest.mark.real_check  # the spec is what the real check validated

TEMPERATURE, LR, SEED = "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.actor.optim.lr", "trainer.seed"


@pytest.fixture
def built(monkeypatch):
    """The ``AgentTrainer`` arguments of each attempt, as the worker built them."""
    seen = []

    class Recorded(training.trainer.AgentTrainer):
        def __init__(self, **kwargs):
            seen.append({key: value for key, value in kwargs.items() if key not in ("sinks", "should_stop", "run_path")})
            super().__init__(**kwargs)

    monkeypatch.setattr(execute, "AgentTrainer", Recorded)
    return seen


def edit_every_row(registry, number: int) -> None:
    """What an administrator may change in each kind of row after a run was queued."""
    agent = registry["agents"]["copy-task"]
    Agent.objects.filter(pk=agent.pk).update(
        agent_args={"edited": number}, default_config={TEMPERATURE: 0.1 * number, "data.max_response_length": 4})
    Dataset.objects.filter(name="copy").update(identifier="nowhere", column_mapping={"prompt": f"edited{number}"})
    RewardFunction.objects.filter(name="char-accuracy").update(path=f"nowhere.edited{number}")
    Model.objects.filter(name="tiny-char").update(default_config={LR: 0.5 / number})
    Backend.objects.filter(name="trl").update(default_config={SEED: 100 + number})


def pause_after_first_check(monkeypatch):
    """The attempt is asked to stop (as a worker's shutdown asks it) at its first step: it is queued again."""
    original = lifecycle.StopCheck.__call__

    def check(self):
        self.pause("the test stops this attempt.")
        return original(self)

    monkeypatch.setattr(lifecycle.StopCheck, "__call__", check)
    return lambda: monkeypatch.setattr(lifecycle.StopCheck, "__call__", original)


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_every_attempt_trains_the_spec_validated_at_submission_whatever_the_registry_says_since(
        owner, registry, copy_form_data, built, monkeypatch, settings, tmp_path, no_queue):
    settings.RUNS_DIR = tmp_path
    Agent.objects.filter(name="copy-task").update(default_config={TEMPERATURE: 0.9, "data.max_response_length": 4})
    Model.objects.filter(name="tiny-char").update(default_config={LR: 0.001})
    Backend.objects.filter(name="trl").update(default_config={SEED: 7})
    form = RunForm(copy_form_data, user=owner)
    assert form.is_valid(), form.errors
    run = form.save(owner)
    validated = run.spec["trainer"]
    assert validated["config"][TEMPERATURE] == 0.9 and validated["config"][LR] == 0.001 and validated["config"][SEED] == 7
    assert validated["train_dataset"] == "copy:train" and validated["reward_func"] == "char_accuracy"

    edit_every_row(registry, 1)
    resume = pause_after_first_check(monkeypatch)
    claim(run.pk, "test-worker")
    assert train_run(run.pk) == Run.Status.QUEUED  # stopped to be resumed by a second attempt

    edit_every_row(registry, 2)
    resume()
    claim(run.pk, "test-worker")
    assert train_run(run.pk) == Run.Status.SUCCEEDED, Run.objects.get(pk=run.pk).error
    run.refresh_from_db()
    assert run.attempts == 2 and run.steps == 3
    first, second = built
    for attempt in (first, second):
        # (may_write, attempt and write_fence: the attempt's fencing; on_full_disk: this worker's disk setting)
        hooks = ("config", "may_write", "attempt", "write_fence", "on_full_disk", "kept_checkpoints")
        assert {key: value for key, value in attempt.items() if key not in hooks} == \
               {key: value for key, value in validated.items() if key != "config"}
        # (with a shared artifact store the worker leaves checkpoint rotation to the store: where it runs)
        assert {key: value for key, value in attempt["config"].items() if key != "trainer.max_checkpoints"} == validated["config"]
    final = run.final_config
    assert final["actor_rollout_ref"]["rollout"]["temperature"] == 0.9
    assert final["actor_rollout_ref"]["actor"]["optim"]["lr"] == 0.001 and final["trainer"]["seed"] == 7
    assert "prompt_key" not in final["data"] or final["data"]["prompt_key"] != "edited2"


def queued_with_spec(make_run, **fields) -> Run:
    """A queued run whose spec was resolved from the rows as they are now (the form's sandbox check is not what these test)."""
    run = make_run(**fields)
    run.spec = run_spec(run_trainer_kwargs(run, ""), run.dataset)
    run.save(update_fields=["spec"])
    return run


@pytest.mark.django_db(transaction=True)
def test_a_backend_disabled_after_queueing_stops_the_run_naming_why(make_run, registry, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    run = queued_with_spec(make_run)
    Backend.objects.filter(name="trl").update(enabled=False)
    claim(run.pk, "test-worker")
    assert train_run(run.pk) == Run.Status.FAILED
    run.refresh_from_db()
    assert run.error.startswith("Backend 'trl' was disabled by an administrator since this run was queued"), run.error
    assert run.steps == 0 and run.final_config is None


@pytest.mark.django_db(transaction=True)
def test_a_model_untrusted_after_queueing_stops_the_run_naming_why(make_run, registry, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    Model.objects.filter(name="tiny-char").update(trust_remote_code=True)
    run = queued_with_spec(make_run)
    assert run.spec["trainer"]["config"]["actor_rollout_ref.model.trust_remote_code"] is True
    Model.objects.filter(name="tiny-char").update(trust_remote_code=False)
    claim(run.pk, "test-worker")
    assert train_run(run.pk) == Run.Status.FAILED
    run.refresh_from_db()
    assert "Model 'tiny-char' is no longer trusted to run its own code" in run.error, run.error
    assert run.final_config is None


@pytest.mark.django_db
def test_a_replaced_upload_keeps_the_validated_file_and_a_deleted_one_is_refused(make_run, owner, registry, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    first = default_storage.save("datasets/rows.jsonl", ContentFile(b'{"prompt": "ab", "ground_truth": "ab"}\n'))
    dataset = Dataset.objects.create(name="rows", source=Dataset.Source.UPLOAD, file=first)
    run = queued_with_spec(make_run, dataset=dataset)
    assert run.spec["stored_files"] == {"train_dataset": first} and run.spec["trainer"]["train_dataset"] is None

    second = default_storage.save("datasets/rows.jsonl", ContentFile(b'{"prompt": "cd", "ground_truth": "cd"}\n'))
    assert second != first  # a new upload never takes an old one's name
    Dataset.objects.filter(pk=dataset.pk).update(file=second)
    assert attempt_kwargs(Run.objects.get(pk=run.pk), "unused")["train_dataset"] == str(tmp_path / first)

    default_storage.delete(first)
    with pytest.raises(Revoked, match=f"The dataset file this run was validated with \\({first}, of dataset 'rows'\\) was deleted"):
        attempt_kwargs(Run.objects.get(pk=run.pk), "unused")


@pytest.mark.django_db
def test_a_run_from_before_specs_gets_its_spec_at_its_first_attempt(make_run, registry):
    run = make_run()
    assert run.spec is None
    kwargs = attempt_kwargs(run, "here")
    stored = Run.objects.get(pk=run.pk).spec
    assert stored["trainer"]["config"] == kwargs["config"] and kwargs["run_path"] == "here"
    Backend.objects.filter(name="trl").update(default_config={SEED: 5})
    assert SEED not in kwargs["config"] and attempt_kwargs(Run.objects.get(pk=run.pk), "here")["config"] == kwargs["config"]


PRIVATE = "--index=/srv/private/customer-index"


@pytest.mark.django_db
def test_the_page_and_the_api_show_the_spec_with_the_registrys_arguments_hidden(
        make_run, owner, owner_client, api_client, registry):
    agent = Agent.objects.create(name="private-args", agent_class="training.MathAgent", env_class="training.MathEnv",
                                 env_args={"server_args": [PRIVATE], "api_key": {"$secret": "SEARCH_KEY"}})
    run = queued_with_spec(make_run, agent=agent)

    shown = api_client(owner).get(f"/api/runs/{run.pk}/").json()["spec"]
    assert shown["env_args"] == {"server_args": HIDDEN, "api_key": HIDDEN}
    assert shown["env_class"] == "training.MathEnv" and shown["config"]["data.train_batch_size"] == 2
    page = html.unescape(owner_client.get(run.get_absolute_url()).content.decode())
    spec = page[page.index('id="run-spec"'):]
    spec = spec[:spec.index("</pre>")]
    assert "env_class: training.MathEnv" in spec and f"server_args: {HIDDEN}" in spec and "data.train_batch_size: 2" in spec
    assert PRIVATE not in page and "SEARCH_KEY" not in spec


@pytest.mark.django_db
def test_a_clone_starts_from_the_spec_not_from_the_rows_as_they_are_now(make_run, owner, owner_client, registry):
    Agent.objects.filter(name="copy-task").update(default_config={TEMPERATURE: 0.9, "data.max_response_length": 4})
    run = queued_with_spec(make_run, agent=Agent.objects.get(name="copy-task"))
    assert run.spec["trainer"]["config"][TEMPERATURE] == 0.9
    Agent.objects.filter(name="copy-task").update(default_config={TEMPERATURE: 0.3, "data.max_response_length": 4})

    form = owner_client.get(f"/runs/new/?clone={run.pk}").context["form"]
    assert f"{TEMPERATURE}: 0.9" in form.initial["overrides"]
    assert form.initial["steps"] == 2 and form.initial["batch_size"] == 2


@pytest.mark.django_db
def test_a_run_created_over_the_api_stores_the_spec_its_check_validated(owner, api_client, registry, no_queue):
    response = api_client(owner).post("/api/runs/", {
        "agent": "copy-task", "dataset": "copy", "reward": "char-accuracy", "backend": "trl", "model": "tiny-char",
        "overrides": {"trainer.total_training_steps": 2, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2}},
        format="json")
    assert response.status_code == 201, response.json()
    run = Run.objects.get(pk=response.json()["id"])
    assert run.spec["trainer"]["config"]["trainer.total_training_steps"] == 2
    assert response.json()["spec"] == api_client(owner).get(f"/api/runs/{run.pk}/").json()["spec"]
    assert response.json()["spec"]["config"]["data.max_response_length"] == 4  # the agent's default, resolved


@pytest.mark.django_db(transaction=True)
def test_a_trainer_that_cannot_be_built_leaves_no_writer_thread_behind(make_run, registry, settings, tmp_path):
    """The sinks are made before the trainer, which closes them when it trains: one never built must
    not leave the metric store's flush thread running in the worker."""
    settings.RUNS_DIR = tmp_path
    run = queued_with_spec(make_run)
    run.spec["trainer"]["config"]["trainer.total_training_steps"] = "many"
    run.save(update_fields=["spec"])
    claim(run.pk, "test-worker")
    assert train_run(run.pk) == Run.Status.FAILED
    run.refresh_from_db()
    assert "trainer.total_training_steps" in run.error, run.error
    assert f"run-{run.pk}-dashboard" not in {thread.name for thread in threading.enumerate() if thread.is_alive()}
