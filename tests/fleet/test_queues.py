"""What a queued run or playground question waits for, and what /fleet/ shows of slots and queues:
read from the database (each worker's own row, written every heartbeat; the runs and questions),
the same with the embedded mode's file broker as with Redis."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.utils import timezone

from webapp.fleet.models import WorkerState
from webapp.playground.models import PlaygroundRequest
from webapp.registry.models import Backend
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db

STEPS_150 = {"trainer.total_training_steps": 150}


@pytest.fixture(autouse=True)
def _no_celery_answers(monkeypatch):
    """The fleet page asks Celery too; here nobody answers (the file broker's case)."""
    from webapp.fleet import control

    monkeypatch.setattr(control, "_reply", lambda method, destination=None: {})
    monkeypatch.setattr(control, "_gpus", lambda: {})


def _cpu_worker(slots: int = 1) -> None:
    WorkerState.objects.seen("cpu@box", ["cpu"], slots)


def _training(make_run, **fields) -> Run:
    return make_run(status=Run.Status.RUNNING, worker="cpu@box", steps=40, started_at=timezone.now(),
                    heartbeat_at=timezone.now(), config_overrides=STEPS_150, **fields)


def _waiting(client, run: Run) -> str:
    return client.get(f"/runs/{run.pk}/waiting.json").json()["waiting"]


def test_a_queued_run_says_which_runs_it_waits_behind(owner_client, make_run):
    _cpu_worker()
    first = _training(make_run, name="first")
    second = make_run(name="second")
    third = make_run(name="third")
    assert _waiting(owner_client, second) == \
        f"Queued: 1st in the 'cpu' queue (1 of 1 slot busy), behind run #{first.pk} (training, step 40/150)."
    assert _waiting(owner_client, third) == (f"Queued: 2nd in the 'cpu' queue (1 of 1 slot busy), behind run #{second.pk} "
                                             f"(queued) and run #{first.pk} (training, step 40/150).")
    page = owner_client.get(f"/runs/{third.pk}/").content.decode()
    assert f"2nd in the &#x27;cpu&#x27; queue (1 of 1 slot busy), behind run #{second.pk} (queued)" in page
    listed = owner_client.get("/").content.decode()
    assert f"behind run #{first.pk} (training, step 40/150)" in listed
    live = owner_client.get(f"/runs/live.json?ids={second.pk},{first.pk}").json()["runs"]
    assert live[str(second.pk)]["waiting"].startswith("Queued: 1st") and live[str(first.pk)]["waiting"] == ""


def test_someone_elses_run_ahead_is_not_named(stranger_client, stranger, make_run):
    _cpu_worker()
    _training(make_run)
    mine = make_run(owner=stranger)
    assert _waiting(stranger_client, mine) == \
        "Queued: 1st in the 'cpu' queue (1 of 1 slot busy), behind a run you cannot see (training)."


def test_no_worker_serves_the_queue(owner_client, make_run):
    gpu = Backend.objects.create(name="gpu-trl", processor="trl", queue="gpu", needs_gpu=True)
    run = make_run(backend=gpu)
    assert _waiting(owner_client, run) == "Queued: no worker serves the 'gpu' queue. It starts when one does."
    WorkerState.objects.create(name="gpu@box", drained=True, queues=["gpu"])
    assert "no worker serves the 'gpu' queue (gpu@box is drained)" in _waiting(owner_client, run)
    WorkerState.objects.seen("gpu@box", ["gpu"], 2)
    WorkerState.objects.filter(name="gpu@box").update(seen_at=timezone.now() - timezone.timedelta(seconds=60))
    assert "no worker serves" in _waiting(owner_client, run)  # its row is stale: it is gone


def test_a_free_slot_and_a_full_backend(owner_client, make_run, registry):
    _cpu_worker(slots=2)
    first = _training(make_run)
    waiting = make_run()
    assert _waiting(owner_client, waiting) == "Queued: a worker of the 'cpu' queue is free; it starts in a moment."
    Backend.objects.filter(pk=registry["backends"]["trl"].pk).update(max_concurrent_runs=1)
    assert _waiting(owner_client, waiting) == \
        f"Queued: its backend trl trains at most 1 run at once, behind run #{first.pk} (training, step 40/150)."


def test_the_api_says_it_too(api_client, owner, make_run):
    _cpu_worker()
    first = _training(make_run)
    second = make_run()
    body = api_client(owner).get(f"/api/runs/{second.pk}/").json()
    assert body["waiting"] == f"Queued: 1st in the 'cpu' queue (1 of 1 slot busy), behind run #{first.pk} (training, step 40/150)."
    listed = {r["id"]: r["waiting"] for r in api_client(owner).get("/api/runs/").json()["results"]}
    assert listed == {first.pk: "", second.pk: body["waiting"]}


def _question(run: Run, user, queue: str = "cpu") -> PlaygroundRequest:
    return PlaygroundRequest.objects.create(run=run, user=user, model_name="final_model", max_new_tokens=8, queue=queue,
                                            messages=[{"role": "user", "content": "hi"}])


def test_a_question_on_the_runs_queue_says_what_it_waits_behind(owner_client, owner, make_run, settings):
    settings.PLAYGROUND_QUEUE = ""
    _cpu_worker()
    first = _training(make_run)
    done = make_run(status=Run.Status.SUCCEEDED)
    _question(done, owner)
    asked = _question(done, owner)
    state = owner_client.get(f"/playground/{asked.pk}.json").json()
    assert state["waiting"] == (f"Waiting behind 1 playground question and run #{first.pk} (training, step 40/150): "
                                f"position 2 in the 'cpu' queue (1 of 1 slot busy). It waits up to 120 s.")


def test_a_question_on_the_playgrounds_own_queue_is_not_behind_runs(owner_client, owner, make_run, settings):
    settings.PLAYGROUND_QUEUE = "playground"
    _cpu_worker()
    _training(make_run)
    WorkerState.objects.seen("playground@box", ["playground"], 1)
    asked = _question(make_run(status=Run.Status.SUCCEEDED), owner, queue="playground")
    state = owner_client.get(f"/playground/{asked.pk}.json").json()
    assert state["waiting"] == "A worker of the 'playground' queue is free: starting…"


def test_the_fleet_page_shows_slots_and_queue_counts(admin_client_, owner, make_run, settings):
    settings.PLAYGROUND_QUEUE = "playground"
    _cpu_worker()
    WorkerState.objects.seen("playground@box", ["playground"], 1)
    first = _training(make_run)
    make_run(), make_run()
    _question(make_run(status=Run.Status.SUCCEEDED), owner, queue="playground")
    page = admin_client_.get("/fleet/")
    workers = {w.name: w for w in page.context["workers"]}
    assert workers["cpu@box"].online and (workers["cpu@box"].busy, workers["cpu@box"].slots) == (1, 1)
    assert (workers["playground@box"].busy, workers["playground@box"].slots) == (0, 1)
    queues = {q.name: q for q in page.context["queues"]}
    assert (queues["cpu"].busy, queues["cpu"].slots, len(queues["cpu"].running), len(queues["cpu"].queued)) == (1, 1, 1, 2)
    assert queues["playground"].questions_waiting == 1
    html = page.content.decode()
    assert "1 busy of 1" in html and f"#{first.pk}" in html


def test_a_worker_writes_its_row_every_heartbeat_and_clears_it_when_it_stops(transactional_db, settings):
    from workers.housekeeping import Housekeeper

    settings.RUN_HEARTBEAT_SECONDS = 1
    queues = SimpleNamespace(consume_from={"cpu": object(), "gpu": object()})
    worker = SimpleNamespace(hostname="embedded@box", concurrency=1, app=SimpleNamespace(amqp=SimpleNamespace(queues=queues)))
    keeper = Housekeeper(worker)
    keeper.tick()
    row = WorkerState.objects.alive().get(name="embedded@box")
    assert (row.serves, row.slots) == (["cpu", "gpu"], 1)
    del queues.consume_from["gpu"]  # drained of gpu
    keeper._last_seen = 0.0
    keeper.tick()
    assert WorkerState.objects.get(name="embedded@box").serves == ["cpu"]
    keeper.start()
    keeper.stop()
    assert not WorkerState.objects.alive().filter(name="embedded@box").exists()
