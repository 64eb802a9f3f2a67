"""The episode store off the training process: a training process under its worker's supervision
only spools each step's episodes (``EpisodeHandoff``), and the supervising process stores them
(``EpisodeDrain``, run by ``workers.execute._supervise``). The training process here is a real
separate process (``handoff_process.py``: the real sink, synthetic episodes instead of a model),
so its parent, its end and its death are real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from webapp.dashboard import episodes as episode_store
from webapp.dashboard.models import StoredEpisode
from webapp.dashboard.recording import DashboardSink, EpisodeDrain, EpisodeHandoff
from webapp.runs import artifacts
from webapp.runs.batching import Spool
from webapp.runs.models import Run, RunLog
from workers.execute import _supervise, claim
from workers.processes import child_env

from episode_records import synthetic

ROOT = Path(__file__).resolve().parents[2]
PROCESS = Path(__file__).resolve().parent / "handoff_process.py"

pytestmark = pytest.mark.django_db(transaction=True)  # the writers use their own connections and processes


def start_training_process(run: Run, folder: Path, runs_dir: Path, steps: int, end: str, **popen) -> subprocess.Popen:
    env = {**child_env(needs_gpu=False), "RUN_DATABASE_RETRY_SECONDS": "20"}
    return subprocess.Popen([sys.executable, str(PROCESS), str(run.pk), str(folder), str(run.attempts), str(runs_dir),
                             str(steps), end], env=env, cwd=ROOT, stdout=subprocess.PIPE, **popen)


def segments(folder: Path) -> list[Path]:
    return sorted((folder / "spool").glob("episodes-*.jsonl"))


def stored(run: Run) -> list[tuple[int, int, float, int]]:
    return list(StoredEpisode.objects.filter(run=run).order_by("step", "position")
                .values_list("step", "position", "reward", "attempt"))


def running_run(make_run, folder: Path) -> Run:
    run = make_run(run_path=str(folder))
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, attempts=1)
    run.refresh_from_db()
    return run


def test_the_training_side_only_spools_each_step_whole_and_the_drain_stores_it(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    folder = tmp_path / "run-folder"
    run = running_run(make_run, folder)
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=folder, attempt=1, episodes_drained=True)
    assert isinstance(sink.episode_writer, EpisodeHandoff)
    assert not any(t.name == f"run-{run.pk}-episodes" for t in threading.enumerate())  # no writer thread here
    for step in (1, 2, 3):
        sink.store_episodes(step, [synthetic(step, p, step / 4) for p in range(4)])
    # One segment a step, whole, named for the attempt; nothing stored by this side.
    waiting = segments(folder)
    assert [Spool.read(path)[0]["stored"][0] for path in waiting] == [1, 2, 3]
    assert all(path.name.endswith("-a1.jsonl") for path in waiting) and not list((folder / "spool").glob("*.partial"))
    assert stored(run) == [] and artifacts.store().list(episode_store.episodes_prefix(run)) == []

    drain = EpisodeDrain(run.pk, folder, attempt=1, flush_seconds=3600)
    drain.flush()
    assert stored(run) == [(s, p, s / 4, 1) for s in (1, 2, 3) for p in range(4)]
    assert segments(folder) == []
    assert episode_store.detail(StoredEpisode.objects.get(run=run, step=2, position=1))["token_ids"] == [4, 5, 6]
    sink.close()  # nothing waits: it returns at once
    drain.close()


def test_the_drain_stores_only_its_own_attempts_segments(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    folder = tmp_path / "run-folder"
    run = running_run(make_run, folder)
    Run.objects.filter(pk=run.pk).update(attempts=2)  # attempt 2 took the run over
    drain = EpisodeDrain(run.pk, folder, attempt=2, flush_seconds=3600)
    stale = EpisodeHandoff(run.pk, folder, attempt=1)  # ... while attempt 1's process still spools
    stale.store(5, [synthetic(5, p, 0.5) for p in range(4)])
    drain.flush()
    drain.close()
    assert stored(run) == []
    assert [path.name.endswith("-a1.jsonl") for path in segments(folder)] == [True]  # left for the spool's adoption rules


def test_a_training_process_ends_once_its_supervisor_has_stored_its_episodes(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    folder = tmp_path / "run-folder"
    run = running_run(make_run, folder)
    go = tmp_path / "close-now"
    process = start_training_process(run, folder, tmp_path, 3, f"close-after:{go}")
    assert process.stdout.readline().strip() == b"spooled"
    go.touch()
    time.sleep(1.0)  # the process is at its end now: it waits for the store, as the run's end must
    assert process.poll() is None and len(segments(folder)) == 3 and stored(run) == []
    drain = EpisodeDrain(run.pk, folder, attempt=1, flush_seconds=0.1)
    assert process.wait(timeout=60) == 0
    drain.close()
    assert stored(run) == [(s, p, s / 4, 1) for s in (1, 2, 3) for p in range(4)]


@pytest.mark.slow  # a supervisor killed
def test_a_training_process_whose_supervisor_is_gone_stores_its_episodes_itself(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    folder = tmp_path / "run-folder"
    run = running_run(make_run, folder)
    go = tmp_path / "close-now"
    # The supervisor: a process that starts the training process and is then killed, as a worker's can be.
    supervisor = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; p = subprocess.Popen(sys.argv[1:]); print(p.pid, flush=True); "
                               "time.sleep(600)",
         sys.executable, str(PROCESS), str(run.pk), str(folder), "1", str(tmp_path), "2", f"close-after:{go}"],
        env={**child_env(needs_gpu=False), "RUN_DATABASE_RETRY_SECONDS": "20"}, cwd=ROOT, stdout=subprocess.PIPE)
    training = psutil.Process(int(supervisor.stdout.readline()))
    deadline = time.monotonic() + 60
    while len(segments(folder)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()
    go.touch()
    training.wait(timeout=60)
    assert stored(run) == [(s, p, s / 4, 1) for s in (1, 2) for p in range(4)]
    assert segments(folder) == []


@pytest.mark.slow  # a training process killed
def test_the_supervisor_stores_what_a_killed_training_process_spooled_before_taking_the_run_back(
        make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    run = make_run()
    claimed = claim(run.pk, "test-worker")
    folder = claimed.folder()
    folder.mkdir(parents=True, exist_ok=True)
    process = start_training_process(claimed, folder, tmp_path, 2, "kill", start_new_session=True)
    status = _supervise(claimed, process, folder / "process.log")
    assert process.returncode == -signal.SIGKILL
    assert stored(run) == [(s, p, s / 4, 1) for s in (1, 2) for p in range(4)]
    assert segments(folder) == []
    assert status == Run.Status.QUEUED  # recovered for its next attempt, after its episodes were stored
    assert RunLog.objects.filter(run=run, message__contains="killed by SIGKILL").exists()


def test_steps_past_the_spools_size_are_dropped_whole_counted_and_said(make_run, tmp_path, settings, caplog):
    settings.RUNS_DIR = tmp_path
    settings.RUN_SPOOL_MAX_MB = 1
    folder = tmp_path / "run-folder"
    run = running_run(make_run, folder)
    handoff = EpisodeHandoff(run.pk, folder, attempt=1)
    big = [dict(synthetic(1, p, 0.0), token_ids=list(range(40_000))) for p in range(4)]  # ~0.8 MB a step
    handoff.store(1, big)
    handoff.store(2, [dict(r, step=2) for r in big])  # the spool would pass 1 MB: dropped whole
    handoff.store(3, [dict(r, step=3) for r in big])
    assert handoff.dropped == 8 and len(segments(folder)) == 1
    assert [r.getMessage().count("not kept in the episode store") for r in caplog.records if r.name == "training"] == [1]
    EpisodeDrain(run.pk, folder, attempt=1, flush_seconds=3600).close()  # stored: the disk counts again
    handoff.store(4, [dict(r, step=4) for r in big])
    assert handoff.dropped == 8 and len(segments(folder)) == 1
    assert os.path.getsize(segments(folder)[0]) > 500_000


def test_the_drain_stores_below_the_priority_of_training(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    run = running_run(make_run, tmp_path / "run-folder")
    drain = EpisodeDrain(run.pk, tmp_path / "run-folder", attempt=1, flush_seconds=0.05)
    try:
        ours = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        deadline = time.monotonic() + 30  # a hang guard: the thread lowers its priority as it starts
        while time.monotonic() < deadline and (drain._thread.native_id is None or os.getpriority(
                os.PRIO_PROCESS, drain._thread.native_id) == ours):
            time.sleep(0.01)
        assert os.getpriority(os.PRIO_PROCESS, drain._thread.native_id) == min(19, ours + 10)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == ours  # this process's others unchanged
    finally:
        drain.close()
