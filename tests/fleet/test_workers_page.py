"""The workers page (admins only): online workers from Celery's inspect, their queues, slots and
runs; drain and resume through Celery's consumer control, remembered in WorkerState."""

from __future__ import annotations

import pytest
from django.utils import timezone

from webapp.fleet.models import WorkerState
from workers.celery_app import app as celery_app


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


class FakeControl:
    """Celery's ``app.control`` as two online workers answer it; records consumer changes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[str]]] = []
        self.queues = {"cpu@box": ["cpu"], "gpu@box": ["gpu"]}

    def inspect(self, timeout=1.0, destination=None):
        control = self

        class Inspect:
            def active_queues(self):
                return {n: [{"name": q} for q in qs] for n, qs in control.queues.items() if not destination or n in destination}

            def stats(self):
                return {"cpu@box": {"pool": {"max-concurrency": 1}}, "gpu@box": {"pool": {"max-concurrency": 2}}}

        return Inspect()

    def broadcast(self, command, reply=False, timeout=1.0):
        assert command == "gpus"
        return [{"gpu@box": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
                              "memory_used_mib": 1200, "utilization_percent": 37}]},
                {"cpu@box": []}]

    def cancel_consumer(self, queue, destination=None, reply=False):
        self.calls.append(("cancel", queue, destination))
        self.queues[destination[0]].remove(queue)

    def add_consumer(self, queue, destination=None, reply=False):
        self.calls.append(("add", queue, destination))
        self.queues[destination[0]].append(queue)


@pytest.fixture
def control(monkeypatch):
    fake = FakeControl()
    monkeypatch.setattr(celery_app, "control", fake)
    return fake


def test_only_admins_see_the_page(client, owner, admin_user, control):
    assert client.get("/fleet/").status_code == 302
    client.force_login(owner)
    assert client.get("/fleet/").status_code == 302  # to the admin login
    assert client.post("/fleet/gpu@box/drain/").status_code == 302 and not control.calls
    client.force_login(admin_user)
    assert client.get("/fleet/").status_code == 200


def test_page_shows_workers_queues_gpus_and_runs(admin_client_, control, make_run, registry):
    from webapp.registry.models import Backend

    Backend.objects.create(name="gpu-trl", processor="trl", queue="gpu", needs_gpu=True)
    beat = timezone.now()
    run = make_run(name="on the gpu", status="running", worker="gpu@box", heartbeat_at=beat)
    page = admin_client_.get("/fleet/")
    workers = {w.name: w for w in page.context["workers"]}
    assert set(workers) == {"cpu@box", "gpu@box"}
    gpu = workers["gpu@box"]
    assert gpu.online and gpu.queues == ["gpu"] and gpu.slots == 2 and gpu.gpu and gpu.runs == [run]
    assert gpu.last_heartbeat == beat and not workers["cpu@box"].gpu
    assert [g["name"] for g in gpu.gpus] == ["NVIDIA H100 80GB HBM3"] and workers["cpu@box"].gpus == []
    html = page.content.decode()
    assert "on the gpu" in html and "2 GPUs" in html and "0: NVIDIA H100 80GB HBM3, 1200 / 81559 MiB, 37%" in html


def test_drain_then_resume(admin_client_, control):
    assert admin_client_.post("/fleet/gpu@box/drain/").status_code == 302
    assert control.calls == [("cancel", "gpu", ["gpu@box"])]
    state = WorkerState.objects.get(name="gpu@box")
    assert state.drained and state.queues == ["gpu"]
    page = admin_client_.get("/fleet/")
    assert {w.name: w.drained for w in page.context["workers"]}["gpu@box"]
    assert "Resume" in page.content.decode()
    assert admin_client_.post("/fleet/gpu@box/resume/").status_code == 302
    assert control.calls[-1] == ("add", "gpu", ["gpu@box"])
    assert not WorkerState.objects.get(name="gpu@box").drained


def test_a_drained_worker_that_restarts_stays_drained(db):
    from celery.signals import worker_ready

    WorkerState.objects.create(name="gpu@box", drained=True, queues=["gpu"])
    cancelled = []

    class Consumer:
        hostname = "gpu@box"

        def cancel_task_queue(self, queue):
            cancelled.append(queue)

    worker_ready.send(sender=Consumer())
    assert cancelled == ["gpu"]


def test_a_disabled_backend_refuses_new_runs_on_the_form(owner_client, copy_form_data, registry):
    from webapp.runs.models import Run

    backend = registry["backends"]["trl"]
    backend.enabled = False
    backend.save()
    response = owner_client.post("/runs/new/", copy_form_data)
    assert "disabled by an administrator" in response.content.decode() and not Run.objects.exists()


def test_backends_are_managed_in_the_admin(admin_client_, registry):
    backend = registry["backends"]["trl"]
    response = admin_client_.post("/admin/registry/backend/", {"action": "disable_backends", "_selected_action": [backend.pk]})
    assert response.status_code == 302
    backend.refresh_from_db()
    assert not backend.enabled
