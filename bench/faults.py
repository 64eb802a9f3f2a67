"""Fault benchmark: for each fault dealt to a training run, the seconds until the run trains again
and the metric points lost and doubled. Results: bench/results/faults.json.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/faults_bench REDIS_URL=redis://127.0.0.1:6379/0 \
        python bench/faults.py [machine_lost celery_killed sigterm redis_outage postgres_outage]

Real Celery worker processes (``-Q`` a queue of their own) train a tiny copy-task run that saves a
checkpoint every step; for the worker faults two workers are up from the start, as in a fleet, and
the fault is dealt to the one that holds the run. Faults:

* machine_lost     SIGKILL of the worker and its training process
* celery_killed    SIGKILL of the Celery processes only (the training process lives on)
* sigterm          SIGTERM of the worker (a deploy)
* redis_outage     Redis cut for 20 s by a TCP proxy (a run is created during the outage too)
* postgres_outage  Postgres cut for 30 s by a TCP proxy

"Trains again" is the time from the fault to the first training step logged by the run's next
attempt (or, where the run kept its attempt, after the fault), by the step's own time stamp as the
training process recorded it. Lost and doubled count steps 1..N of the
``reward`` series missing or stored twice, in the metric points and in the dashboard's series
blocks. Heartbeats and thresholds are the production defaults (``webapp/settings.py``). Where a run
is given up and resumed, ``seconds_until_requeued`` and ``seconds_until_claimed`` say where the time
went (detection, then dispatch, then the new training process's start-up until its first step).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from tempfile import mkdtemp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "reliability"))

from benchdb import migrated_postgres  # noqa: E402  (bench/ is the script's folder)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
RESULTS = ROOT / "bench" / "results" / "faults.json"
STEPS = 30
TIMEOUT = 600


def setup_django() -> None:
    migrated_postgres(need_redis=True)
    from django.contrib.auth import get_user_model

    get_user_model().objects.get_or_create(username="faults-bench")


class Scenario:
    def __init__(self, name: str) -> None:
        from django.conf import settings

        self.name = name
        self.queue = f"bench-faults-{uuid.uuid4().hex[:8]}"
        self.log_dir = Path(mkdtemp(prefix=f"faults-{name}-"))
        self.env = {"DATABASE_URL": os.environ["DATABASE_URL"], "REDIS_URL": settings.REDIS_URL,
                    "PLATFORM_VAR_DIR": str(self.log_dir / "var")}
        self.workers = []

    def worker(self, tag: str, **env: str):
        from fault_harness import start_worker

        worker = start_worker(self.queue, tag, {**self.env, **env}, self.log_dir, thresholds={})
        self.workers.append(worker)
        return worker

    def run(self):
        from django.contrib.auth import get_user_model
        from fault_harness import SLOW_REWARD, run_overrides

        from webapp.registry.models import Agent, Backend, Dataset, RewardFunction
        from webapp.runs.models import Run

        backend = Backend.objects.get(name="trl")
        Backend.objects.filter(pk=backend.pk).update(queue=self.queue, max_attempts=3)
        reward, _ = RewardFunction.objects.get_or_create(name="slow-char", defaults={"path": SLOW_REWARD})
        return Run.objects.create(
            owner=get_user_model().objects.get(username="faults-bench"), name=f"faults {self.name}",
            agent=Agent.objects.get(name="copy-task"), dataset=Dataset.objects.get(name="copy"), reward=reward,
            backend=backend, model="tiny-char", config_overrides=run_overrides(STEPS),
        )

    def wait_for_step(self, run, step: int) -> None:
        from fault_harness import latest_step, wait_for

        wait_for(lambda: latest_step(run.pk) >= step, TIMEOUT, f"step {step}", tuple(self.workers), poll=0.1)

    def result(self, run, fault_at: datetime, **extra) -> dict:
        from fault_harness import lost_and_doubled, wait_for

        from webapp.runs.models import Run, RunLog

        wait_for(lambda: Run.objects.get(pk=run.pk).is_final, TIMEOUT, "the run to end", tuple(self.workers), poll=0.5)
        run.refresh_from_db()
        lost, doubled = lost_and_doubled(run.pk, STEPS)
        # Where the time went: the attempt given up (re-queued), the next one claimed, its first step.
        milestones, since = {}, fault_at
        for name, text in (("requeued", "Attempt 1 ended"), ("claimed", "(attempt 2 of")):
            line = RunLog.objects.filter(run=run, message__contains=text, time__gt=fault_at).order_by("time").first()
            if line is not None:
                milestones[f"seconds_until_{name}"] = round((line.time - fault_at).total_seconds(), 1)
                since = line.time
        # Trains again: the first step the next attempt logged (a step the stopped attempt finished
        # after the fault is not training again); without a next attempt, the first step after the fault.
        # (The trainer's line for each logged step, stamped when it was reported: points carry no time.)
        after = RunLog.objects.filter(run=run, time__gt=since, message__startswith="step ").order_by("time").first()
        return {
            "status": run.status, "attempts": run.attempts, "lost_attempts": run.lost_attempts,
            "seconds_until_training_again": round((after.time - fault_at).total_seconds(), 1) if after else None,
            **milestones, "points_lost": lost, "points_doubled": doubled, **extra,
        }

    def close(self) -> None:
        for worker in self.workers:
            worker.stop(timeout=10)


def worker_fault(name: str, inject) -> dict:
    """A fleet of two workers, "a" and "b", both up before the run is created (as standing workers
    are, their spare training processes ready); the one that claims it trains until step 3, then
    ``inject(that worker)`` is the fault and returns extra figures for the result."""
    from fault_harness import wait_for

    from webapp.runs.models import Run

    scenario = Scenario(name)
    try:
        fleet = [scenario.worker("a"), scenario.worker("b")]
        run = scenario.run()
        scenario.wait_for_step(run, 3)
        holder = wait_for(lambda: next((w for w in fleet if Run.objects.get(pk=run.pk).worker.startswith(w.name + "@")), None),
                          60, "the worker holding the run", tuple(fleet))
        fault_at = _now()
        extra = inject(holder) or {}
        return scenario.result(run, fault_at, **extra)
    finally:
        scenario.close()


def machine_lost() -> dict:
    return worker_fault("machine_lost", lambda worker: worker.kill())


def celery_killed() -> dict:
    def kill_celery(worker) -> None:
        worker.kill_celery_only()

    return worker_fault("celery_killed", kill_celery)


def sigterm() -> dict:
    def terminate(worker) -> dict:
        started = time.monotonic()
        worker.process.terminate()
        worker.process.wait(timeout=TIMEOUT)
        return {"worker_exit_seconds": round(time.monotonic() - started, 1)}

    return worker_fault("sigterm", terminate)


def redis_outage(seconds: float = 20) -> dict:
    from django.conf import settings
    from tcp_proxy import TcpProxy

    from webapp.runs.models import Run

    host, port = settings.REDIS_URL.split("//")[1].split("/")[0].split(":")
    proxy = TcpProxy(host, int(port))
    scenario = Scenario("redis_outage")
    try:
        scenario.worker("a", REDIS_URL=f"redis://127.0.0.1:{proxy.port}/{settings.REDIS_URL.rsplit('/', 1)[1]}")
        run = scenario.run()
        scenario.wait_for_step(run, 3)
        fault_at = _now()
        proxy.cut()
        during = scenario.run()  # created while the broker is away: recorded, sent when it is back
        time.sleep(seconds)
        proxy.restore()
        restored = time.monotonic()
        scenario.wait_for_step(during, 1)
        created_meanwhile = {"seconds_from_restore_to_first_step": round(time.monotonic() - restored, 1)}
        result = scenario.result(run, fault_at, outage_seconds=seconds)
        created_meanwhile.update({k: v for k, v in scenario.result(during, fault_at).items()
                                  if k in ("status", "points_lost", "points_doubled")})
        result["run_created_during_outage"] = created_meanwhile
        assert Run.objects.filter(status=Run.Status.QUEUED).count() == 0
        return result
    finally:
        scenario.close()
        proxy.close()


def postgres_outage(seconds: float = 30) -> dict:
    from django.db import connection
    from tcp_proxy import TcpProxy

    from workers.processes import database_url

    db = connection.settings_dict
    proxy = TcpProxy(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    scenario = Scenario("postgres_outage")
    try:
        scenario.worker("a", DATABASE_URL=database_url({**db, "HOST": "127.0.0.1", "PORT": str(proxy.port)}))
        run = scenario.run()
        scenario.wait_for_step(run, 3)
        fault_at = _now()
        proxy.cut()
        time.sleep(seconds)
        proxy.restore()
        return scenario.result(run, fault_at, outage_seconds=seconds)
    finally:
        scenario.close()
        proxy.close()


def _now() -> datetime:
    return datetime.now(timezone.utc)


BENCHES = {"machine_lost": machine_lost, "celery_killed": celery_killed, "sigterm": sigterm,
           "redis_outage": redis_outage, "postgres_outage": postgres_outage}


def main(names: list[str]) -> None:
    setup_django()
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name in names or list(BENCHES):
        print(f"{name} ...", flush=True)
        results[name] = {**BENCHES[name](), "measured_at": _now().isoformat(timespec="seconds"),
                         "machine": f"{platform.node()}, {os.cpu_count()} cores"}
        print(json.dumps(results[name]), flush=True)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
