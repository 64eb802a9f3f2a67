"""Talking to Celery workers: who is online, what they consume, draining and resuming them.

Drain = ``cancel_consumer`` for each of the worker's queues (its current run goes on; it takes no
new message), recorded in ``WorkerState`` so the page shows it and a restarted worker is drained
again. Resume = ``add_consumer`` for the recorded queues.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from webapp.celery_app import app as celery_app
from webapp.fleet.models import WorkerState
from webapp.fleet.queues import QueueBoard
from webapp.registry.models import Backend
from webapp.runs.models import Run

logger = logging.getLogger(__name__)

INSPECT_TIMEOUT = 1.0


@dataclass
class WorkerInfo:
    name: str
    online: bool
    queues: list[str] = field(default_factory=list)
    slots: int = 0  # pool processes: one run each (one GPU each on a GPU worker)
    busy: int = 0  # slots holding a run or a playground answer
    gpu: bool = False
    gpus: list[dict] = field(default_factory=list)  # what the worker reports (workers.gpus.inventory)
    drained: bool = False
    runs: list[Run] = field(default_factory=list)
    last_heartbeat: datetime | None = None


def _reply(method: str, destination: list[str] | None = None) -> dict:
    inspector = celery_app.control.inspect(timeout=INSPECT_TIMEOUT, destination=destination)
    try:
        return getattr(inspector, method)() or {}
    except Exception:  # broker down: the page still shows what the database knows
        logger.exception("celery inspect %s failed", method)
        return {}


def _gpus() -> dict[str, list[dict]]:
    """Each online worker's GPUs, from the ``gpus`` inspect command that workers/celery_app.py adds."""
    try:
        replies = celery_app.control.broadcast("gpus", reply=True, timeout=INSPECT_TIMEOUT)
    except Exception:  # broker down: no GPU details
        logger.exception("celery inspect gpus failed")
        return {}
    merged: dict[str, list[dict]] = {}
    for reply in replies or []:
        for name, gpus in reply.items():
            merged[name] = gpus if isinstance(gpus, list) else []  # an older worker answers with an error
    return merged


def list_workers(board: QueueBoard | None = None) -> list[WorkerInfo]:
    """Online workers (Celery inspect, or their own rows written every heartbeat: the embedded mode's
    file broker answers no inspect) plus any that hold a running run or were drained."""
    board = board or QueueBoard.load()
    gpu_queues = set(Backend.objects.filter(needs_gpu=True).values_list("queue", flat=True))
    # Each request waits out INSPECT_TIMEOUT for replies: asked together, the page waits once.
    with ThreadPoolExecutor(max_workers=3) as pool:
        asked = pool.submit(_reply, "active_queues"), pool.submit(_reply, "stats"), pool.submit(_gpus)
    active_queues, stats, gpus = (future.result() for future in asked)
    queues_by_worker = {name: [q["name"] for q in queues] for name, queues in active_queues.items()}
    states = {s.name: s for s in WorkerState.objects.all()}
    alive = {w.name: w for w in board.workers}
    running = Run.objects.filter(status=Run.Status.RUNNING).exclude(worker="").select_related("backend").order_by("started_at")
    runs_by_worker: dict[str, list[Run]] = {}
    for run in running:
        runs_by_worker.setdefault(run.worker, []).append(run)
    names = sorted(set(queues_by_worker) | set(stats) | set(alive) | set(runs_by_worker)
                   | {n for n, s in states.items() if s.drained})
    workers = []
    for name in names:
        state = states.get(name)
        queues = queues_by_worker.get(name) or (alive[name].serves if name in alive else []) or (state.queues if state else [])
        runs = runs_by_worker.get(name, [])
        slots = int((stats.get(name) or {}).get("pool", {}).get("max-concurrency") or 0) or (alive[name].slots if name in alive else 0)
        workers.append(WorkerInfo(
            name=name, online=name in queues_by_worker or name in stats or name in alive, queues=queues,
            slots=slots, busy=board.busy_slots(name),
            gpu=bool(gpu_queues & set(queues)), gpus=gpus.get(name, []), drained=bool(state and state.drained), runs=runs,
            last_heartbeat=max((r.heartbeat_at for r in runs if r.heartbeat_at), default=None),
        ))
    return workers


def drain(name: str, user=None) -> list[str]:
    """Stop ``name`` taking new runs from each queue it consumes. Returns those queues."""
    queues = [q["name"] for q in _reply("active_queues", [name]).get(name, [])]
    state, _ = WorkerState.objects.get_or_create(name=name)
    queues = queues or state.queues  # already drained: keep what it consumed before
    for queue in queues:
        celery_app.control.cancel_consumer(queue, destination=[name], reply=False)
    WorkerState.objects.filter(pk=state.pk).update(drained=True, queues=queues, changed_by=user)
    return queues


def resume(name: str, user=None) -> list[str]:
    """Let a drained worker take runs again from the queues it consumed before the drain."""
    state, _ = WorkerState.objects.get_or_create(name=name)
    for queue in state.queues:
        celery_app.control.add_consumer(queue, destination=[name], reply=False)
    WorkerState.objects.filter(pk=state.pk).update(drained=False, changed_by=user)
    return list(state.queues)

