"""A remote Ray cluster (``trainer.ray_address``, set by an administrator on a Backend) is refused
on the platform until a superseded attempt's Ray job there can be stopped (docs/platform.md): by
the admin's form, by the run form (the backend is unusable, with why), and where a run queued
before is trained."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from webapp.registry.models import Backend
from webapp.runs.forms import RunForm
from webapp.runs.models import Run
from webapp.runs.trainer_args import run_spec, run_trainer_kwargs
from workers.execute import claim, train_run

REFUSED = "trainer.ray_address joins a Ray cluster the training process did not start"


def test_a_backend_joining_a_ray_cluster_is_refused_by_the_admin(registry):
    backend = Backend(name="verl-cluster", processor="verl", default_config={"trainer.ray_address": "auto"})
    with pytest.raises(ValidationError, match=REFUSED):
        backend.full_clean()
    Backend(name="verl-local", processor="verl", default_config={"trainer.ray_address": None}).full_clean()


def test_the_run_form_refuses_a_backend_set_to_join_a_ray_cluster(registry, owner, copy_form_data):
    Backend.objects.filter(name="trl").update(default_config={"trainer.ray_address": "head-host:6379"})
    form = RunForm(copy_form_data, user=owner)
    assert not form.is_valid()
    assert REFUSED in " ".join(form.errors["backend"])


@pytest.mark.django_db(transaction=True)
def test_a_run_queued_before_the_refusal_is_not_trained(make_run, registry, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    Backend.objects.filter(name="trl").update(default_config={"trainer.ray_address": "auto"})
    run = Run.objects.get(pk=make_run().pk)  # its backend as the administrator set it
    run.spec = run_spec(run_trainer_kwargs(run, ""), run.dataset)
    run.save(update_fields=["spec"])
    assert run.spec["trainer"]["config"]["trainer.ray_address"] == "auto"
    claim(run.pk, "test-worker")
    assert train_run(run.pk) == Run.Status.FAILED
    run.refresh_from_db()
    assert run.error.startswith(REFUSED) and "It was not trained." in run.error, run.error
    assert run.steps == 0 and run.final_config is None
