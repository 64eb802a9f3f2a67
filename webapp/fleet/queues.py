"""What each worker queue holds and who serves it, read from the database: the workers' rows (each
worker writes its queues and slots every heartbeat, ``WorkerState``), the runs queued and running,
the playground's questions. Never the broker: the embedded mode's file broker answers no inspect,
and a broker's queue length counts messages, not the runs behind them (a run is sent again when
its message is lost; a busy backend's run waits in the outbox).

``QueueBoard.load()`` reads it all once, so a page of runs asks each of them in memory:

* ``run_waiting(run, user)``: why a queued run has not started, "2nd in the 'cpu' queue, behind run
  #12 (training, step 40/150)", "no worker serves the 'gpu' queue", "its backend runs at most 1 at once";
* ``question_waiting(asked, user)``: the same for a playground question;
* ``queues()``: per queue, its workers, slots busy of total, runs queued and running, questions waiting.

A run ``user`` may not see is named as such, without its number or progress.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.humanize.templatetags.humanize import ordinal

from webapp.fleet.models import WorkerState
from webapp.playground.models import PlaygroundRequest
from webapp.registry.models import Backend
from webapp.runs.downloads import total_steps
from webapp.runs.models import Run

# How many runs a waiting message names before it counts the rest.
NAMED = 2


@dataclass
class QueueState:
    name: str
    workers: list[WorkerState] = field(default_factory=list)  # alive and consuming it
    drained: list[str] = field(default_factory=list)  # drained workers that consumed it before
    slots: int = 0
    busy: int = 0  # slots of its workers holding a run or an answer
    running: list[Run] = field(default_factory=list)  # its runs that train now
    queued: list[Run] = field(default_factory=list)  # its queued runs, in the order they are sent
    questions_waiting: int = 0
    questions_answering: int = 0

    @property
    def free(self) -> int:
        return max(0, self.slots - self.busy)


class QueueBoard:
    def __init__(self, workers: list[WorkerState], drained: list[WorkerState], running: list[Run], queued: list[Run],
                 questions: list[PlaygroundRequest], capacity: dict[int, int]) -> None:
        self.workers = workers
        self.running = running
        self.queued = queued
        self.questions = questions
        self.capacity = capacity  # backend id -> max_concurrent_runs (0: no limit)
        self._seen: dict[int | None, set[int]] = {}
        answering = [q for q in questions if q.status == PlaygroundRequest.Status.RUNNING]
        held = Counter(r.worker for r in running) + Counter(q.worker for q in answering)
        self.held_by = {w.name: [r for r in running if r.worker == w.name] for w in workers}
        self.answering_on = Counter(q.worker for q in answering)
        names = {r.backend.queue for r in running + queued} | {q.queue for q in questions}
        names |= {queue for w in workers for queue in w.serves}
        names |= set(Backend.objects.filter(enabled=True).values_list("queue", flat=True))
        if settings.PLAYGROUND_QUEUE:
            names.add(settings.PLAYGROUND_QUEUE)
        self._queues: dict[str, QueueState] = {}
        for name in sorted(names):
            state = QueueState(name=name)
            state.workers = [w for w in workers if name in w.serves]
            state.drained = [w.name for w in drained if name in (w.queues or [])]
            state.slots = sum(w.slots for w in state.workers)
            state.busy = sum(min(w.slots, held[w.name]) for w in state.workers)
            state.running = [r for r in running if r.backend.queue == name]
            state.queued = [r for r in queued if r.backend.queue == name]
            state.questions_waiting = sum(1 for q in questions if q.queue == name and q.status == q.Status.QUEUED)
            state.questions_answering = sum(1 for q in answering if q.queue == name)
            self._queues[name] = state

    @classmethod
    def load(cls) -> "QueueBoard":
        workers = list(WorkerState.objects.alive())
        drained = list(WorkerState.objects.filter(drained=True))
        runs = Run.objects.filter(kind=Run.Kind.PLATFORM).select_related("backend").order_by("created_at", "pk")
        running = list(runs.filter(status=Run.Status.RUNNING))
        queued = list(runs.filter(status=Run.Status.QUEUED))
        questions = list(PlaygroundRequest.objects.pending().order_by("created_at", "pk"))
        capacity = dict(Backend.objects.values_list("pk", "max_concurrent_runs"))
        return cls(workers, drained, running, queued, questions, capacity)

    def queues(self) -> list[QueueState]:
        return list(self._queues.values())

    def queue(self, name: str) -> QueueState:
        return self._queues.get(name) or QueueState(name=name)

    def busy_slots(self, worker: str) -> int:
        return len(self.held_by.get(worker, [])) + self.answering_on[worker]

    # -- what a queued run waits for -------------------------------------------------------------
    def run_waiting(self, run: Run, user) -> str:
        """Why queued ``run`` has not started yet, in words for its page, the runs list and the API."""
        if run.status != Run.Status.QUEUED or run.kind != Run.Kind.PLATFORM or run.backend is None:
            return ""
        queue = self.queue(run.backend.queue)
        visible = self._visible(user)
        if not queue.workers:
            return self._nobody(queue) + " It starts when one does."
        limit = self.capacity.get(run.backend_id) or 0
        same_backend = [r for r in self.running if r.backend_id == run.backend_id]
        if limit and len(same_backend) >= limit:
            return (f"Queued: its backend {run.backend.name} trains at most {limit} run{'s' if limit > 1 else ''} at once, "
                    f"behind {self._describe(same_backend, visible)}.")
        ahead = [r for r in queue.queued if (r.created_at, r.pk) < (run.created_at, run.pk)]
        if queue.free > len(ahead):
            return f"Queued: a worker of the '{queue.name}' queue is free; it starts in a moment."
        return (f"Queued: {ordinal(len(ahead) + 1)} in the '{queue.name}' queue "
                f"({self._slots(queue)}), behind {self._behind(queue, ahead, visible)}.")

    # -- what a playground question waits for ----------------------------------------------------
    def question_waiting(self, asked: PlaygroundRequest, user) -> str:
        """Why queued question ``asked`` is not answered yet."""
        if asked.status != PlaygroundRequest.Status.QUEUED:
            return ""
        queue = self.queue(asked.queue)
        wait = f"It waits up to {settings.PLAYGROUND_QUEUE_SECONDS} s."
        if not queue.workers:
            return f"{self._nobody(queue)} {wait}"
        runs_ahead = [r for r in queue.queued if r.created_at < asked.created_at]
        questions_ahead = sum(1 for q in self.questions if q.queue == asked.queue and q.status == q.Status.QUEUED
                              and (q.created_at, q.pk) < (asked.created_at, asked.pk))
        if queue.free > len(runs_ahead) + questions_ahead:
            return f"A worker of the '{queue.name}' queue is free: starting…"
        before = self._behind(queue, runs_ahead, self._visible(user), questions_ahead)
        return (f"Waiting behind {before}: position {len(runs_ahead) + questions_ahead + 1} in the "
                f"'{queue.name}' queue ({self._slots(queue)}). {wait}")

    # -- words -----------------------------------------------------------------------------------
    def _nobody(self, queue: QueueState) -> str:
        drained = f" ({', '.join(queue.drained)} {'is' if len(queue.drained) == 1 else 'are'} drained)" if queue.drained else ""
        return f"Queued: no worker serves the '{queue.name}' queue{drained}."

    def _slots(self, queue: QueueState) -> str:
        return f"{queue.busy} of {queue.slots} slot{'s' if queue.slots != 1 else ''} busy"

    def _behind(self, queue: QueueState, ahead: list[Run], visible, questions_ahead: int = 0) -> str:
        parts = []
        if len(ahead) > NAMED:
            parts.append(f"{len(ahead)} queued runs")
        elif ahead:
            parts.append(self._describe(list(reversed(ahead)), visible))
        if questions_ahead:
            parts.append(f"{questions_ahead} playground question{'s' if questions_ahead > 1 else ''}")
        holders = [r for w in queue.workers for r in self.held_by.get(w.name, [])]
        if holders:
            parts.append(self._describe(holders, visible))
        answering = sum(self.answering_on[w.name] for w in queue.workers)
        if answering:
            parts.append(f"{answering} playground answer{'s' if answering > 1 else ''}")
        if not parts:
            return "workers with no free slot"
        return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]

    def _describe(self, runs: list[Run], visible) -> str:
        named = [self._run(r, visible) for r in runs[:NAMED]]
        more = len(runs) - len(named)
        if more:
            named.append(f"{more} more")
        return ", ".join(named[:-1]) + (" and " if len(named) > 1 else "") + named[-1]

    @staticmethod
    def _run(run: Run, visible) -> str:
        if run.status == Run.Status.QUEUED:
            state = "queued"
        elif run.steps:
            total = total_steps(run)
            state = f"training, step {run.steps}/{total}" if total else f"training, step {run.steps}"
        else:
            state = "starting"
        return f"run #{run.pk} ({state})" if visible(run) else f"a run you cannot see ({'queued' if state == 'queued' else 'training'})"

    def _visible(self, user):
        """Whether ``user`` may see a run of the board (one query per person, however many runs ask)."""
        key = getattr(user, "pk", None)
        if key not in self._seen:
            ids = {r.pk for r in self.running + self.queued}
            self._seen[key] = set(Run.objects.visible_to(user).filter(pk__in=ids).values_list("pk", flat=True)) \
                if user is not None else set()
        seen = self._seen[key]
        return lambda run: run.pk in seen
