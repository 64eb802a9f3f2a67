"""What the fault-injection tests and ``bench/faults.py`` share: real Celery workers started as
processes (with short heartbeats and thresholds), faults dealt to them, and the check that a run's
series holds every logged step exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
SLOW_REWARD = str(Path(__file__).with_name("slow_reward.py")) + ":slow_char_accuracy"
# Short enough that a lost run is found in seconds; the defaults (5 s / 20 s) are for production.
FAST_SETTINGS = {
    "RUN_HEARTBEAT_SECONDS": "1", "RUN_STALE_SECONDS": "4", "RUN_SWEEP_SECONDS": "1",
    "RUN_SHUTDOWN_GRACE_SECONDS": "30", "RUN_REDISPATCH_SECONDS": "30", "RUN_CANCEL_GRACE_SECONDS": "30",
}


def run_overrides(steps: int) -> dict:
    """A tiny copy-task run that saves a checkpoint every step (what a resumed attempt starts from),
    without scoring the test set first (seconds no fault needs)."""
    return {"trainer.total_training_steps": steps, "trainer.save_freq": 1, "trainer.cpu_threads": 1,
            "trainer.val_before_train": False,
            "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2, "data.max_response_length": 4}


@dataclass
class Worker:
    process: subprocess.Popen
    name: str
    log: Path

    def tree(self) -> list[psutil.Process]:
        try:
            main = psutil.Process(self.process.pid)
            return [main, *main.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def training_processes(self) -> list[psutil.Process]:
        return [p for p in self.tree() if "workers.child" in " ".join(_cmdline(p))]

    def kill(self) -> None:
        """The machine is lost: SIGKILL the worker and every process it started."""
        _kill(self.tree())
        self.process.wait(timeout=30)

    def kill_celery_only(self) -> float:
        """SIGKILL the Celery processes, leaving the training process (and its children) alive."""
        training = set()
        for process in self.training_processes():
            training.add(process.pid)
            training.update(child.pid for child in process.children(recursive=True))
        _kill([p for p in self.tree() if p.pid not in training])
        self.process.wait(timeout=30)

    def stop(self, timeout: float = 60) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        _kill(self.tree())

    def log_tail(self, size: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""


def start_worker(queue: str, tag: str, env: dict[str, str], log_dir: Path,
                 thresholds: dict[str, str] = FAST_SETTINGS, machine_faults: bool = True) -> Worker:
    """A ``celery worker`` process on ``queue`` (``thresholds``: settings it runs with; {} for the defaults).

    ``machine_faults``: the test kills, freezes or stops this worker as a machine, so its children must
    be in its process tree: the session's warm process is not named to it (WORKER_WARM_PROCESS emptied),
    and its children start plain or forked from its own warm process (RUN_WARM_PROCESS). A worker the
    test deals no such fault (one that takes a run over, or one behind an outage of a server) forks its
    children from the session's warm process, as the platform's other test workers do (the children of
    a run that ends before the test does: a test that stops it midway would leave them running)."""
    name = f"{queue}-{tag}"
    log = log_dir / f"{name}.log"
    own_tree = {"WORKER_WARM_PROCESS": ""} if machine_faults else {}
    with open(log, "ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", queue, "--concurrency", "1",
             "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"],
            cwd=ROOT, env={**os.environ, **own_tree, **thresholds, **env}, stdout=output, stderr=subprocess.STDOUT,
        )
    return Worker(process, name, log)


def wait_for(predicate, timeout: float, what: str, workers: tuple[Worker, ...] = (), poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    logs = "\n".join(f"--- {w.name} ---\n{w.log_tail()}" for w in workers)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{logs}")


def private_trl_queue(prefix: str) -> str:
    """A queue no other worker listens on, made the ``trl`` backend's (three attempts per run)."""
    import uuid

    from webapp.registry.models import Backend

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    Backend.objects.filter(name="trl").update(queue=name, max_attempts=3)
    return name


def slow_run_maker(make_run):
    """``make(steps, **overrides)``: a queued run whose reward sleeps, so faults land mid-run."""
    from webapp.registry.models import RewardFunction

    reward = RewardFunction.objects.create(name="slow-char", path=SLOW_REWARD)

    def make(steps: int, **overrides):
        run = make_run(reward=reward, config_overrides={**run_overrides(steps), **overrides})
        run.enqueue()
        return run

    return make


def finished(run, workers: tuple[Worker, ...], timeout: float):
    """``run`` reloaded once it has ended (its workers' logs in the error if it does not)."""
    from webapp.runs.models import Run

    wait_for(lambda: Run.objects.get(pk=run.pk).is_final, timeout, f"run {run.pk} to end", workers)
    run.refresh_from_db()
    return run


def stored_steps(run_id: int, key: str = "reward") -> dict[str, list[int]]:
    """The steps of ``key`` as the metric store holds them."""
    from webapp.dashboard import series

    return {"series": [step for step, _ in series.points_after(run_id, -1).get(key, [])]}


def lost_and_doubled(run_id: int, steps: int, key: str = "reward") -> tuple[int, int]:
    """(steps missing, steps stored more than once) for a run that logged 1..steps."""
    lost = doubled = 0
    for stored in stored_steps(run_id, key).values():
        lost += len(set(range(1, steps + 1)) - set(stored))
        doubled += len(stored) - len(set(stored))
    return lost, doubled


def latest_step(run_id: int, key: str = "reward") -> int:
    from webapp.dashboard import series

    return max((step for step, _ in series.points_after(run_id, -1).get(key, [])), default=0)


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _kill(processes: list[psutil.Process]) -> None:
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass
