"""Ended attempts' own folders (``<run>/attempts/<n>``) are removed by each worker's housekeeping
sweep once nothing of their writer can run: a superseded attempt's once its training process's
session is dead, the finished run's after the end. A writer that may still run (alive, frozen, or on
another machine, or not recorded) keeps its folder, and so does a folder the run's row names; the
run's published checkpoints (hard links of what an attempt saved) are never touched.

Real files, real processes (each attempt's writer leads a session of its own, as a training process
does), real Postgres."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from webapp.runs.models import Checkpoint, Run
from workers.execute import claim
from workers.lifecycle import Attempt, remove_ended_attempt_folders
from workers.processes import WRITER_FILE, child_env, kill_session, record_writer

pytestmark = pytest.mark.django_db(transaction=True)  # the attempt's recorder writes from its own thread

ROOT = Path(__file__).resolve().parents[2]
WRITER = """import sys, time
sys.path.insert(0, sys.argv[2])
from workers.processes import record_writer
record_writer(sys.argv[1])
print("recorded", flush=True)
time.sleep(600)
"""


def start_writer(folder: Path) -> subprocess.Popen:
    """An attempt's training process as far as its folder goes: a session leader that records itself
    as the folder's writer, then runs on."""
    process = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(ROOT)], stdout=subprocess.PIPE,
                               env=child_env(needs_gpu=False), start_new_session=True, cwd=ROOT)
    assert process.stdout.readline() == b"recorded\n"
    return process


def dead_writer(folder: Path) -> None:
    kill_session(start_writer(folder))


def save(run_folder: Path, attempt: int, step: int) -> Path:
    """A checkpoint the attempt saved whole in its own folder."""
    saved = run_folder / "attempts" / str(attempt) / "checkpoints" / f"checkpoint-{step}"
    saved.mkdir(parents=True)
    (saved / "model.safetensors").write_bytes(os.urandom(4096))
    (saved / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return saved


def publish(saved: Path, run_folder: Path) -> None:
    """Into the run's checkpoints as ``TrainerProcessor.publish`` does it: hard links, one rename."""
    staged = saved.parent.parent / "publishing" / saved.name
    shutil.copytree(saved, staged, copy_function=os.link)
    (run_folder / "checkpoints").mkdir(exist_ok=True)
    os.rename(staged, run_folder / "checkpoints" / saved.name)


def published(run_folder: Path) -> dict[str, str]:
    return {str(p.relative_to(run_folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((run_folder / "checkpoints").rglob("*")) if p.is_file()}


def test_a_superseded_attempts_folder_goes_once_its_session_is_dead_and_the_last_one_after_the_end(make_run, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    run = claim(make_run().pk, "first-worker")
    folder = run.folder()
    first = start_writer(folder / "attempts" / "1")
    try:
        publish(save(folder, 1, 2), folder)
        save(folder, 1, 4)  # saved, never published: the run was taken over
        assert run.requeue("its worker was lost.")  # attempt 1 presumed lost; its process runs on (frozen, say)
        run = claim(run.pk, "second-worker")
        assert run.attempts == 2
        second = start_writer(folder / "attempts" / "2")
        publish(save(folder, 2, 6), folder)
        before = published(folder)

        assert remove_ended_attempt_folders() == []  # attempt 1's writer may still write; attempt 2 holds the run
        assert (folder / "attempts" / "1" / "checkpoints" / "checkpoint-4").is_dir()
    finally:
        kill_session(first)
    assert remove_ended_attempt_folders() == [folder / "attempts" / "1"]
    assert not (folder / "attempts" / "1").exists() and (folder / "attempts" / "2" / WRITER_FILE).is_file()
    assert published(folder) == before  # what it published stays, whole

    kill_session(second)
    assert remove_ended_attempt_folders() == []  # the run's current attempt: the liveness sweep's to judge
    assert run.finish(Run.Status.SUCCEEDED)
    assert remove_ended_attempt_folders() == [folder / "attempts" / "2"]
    assert not (folder / "attempts").exists()
    assert published(folder) == before and sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-6"]


def test_a_folder_is_kept_while_its_writer_cannot_be_told_gone_or_the_run_names_it(make_run, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    run = claim(make_run().pk, "w")
    folder = run.folder()
    attempts = folder / "attempts"
    record_writer(attempts / "1")  # another machine's writer: that machine's workers judge it
    elsewhere = json.loads((attempts / "1" / WRITER_FILE).read_text())
    (attempts / "1" / WRITER_FILE).write_text(json.dumps({**elsewhere, "host": "another-machine"}))
    save(folder, 2, 1)  # no writer recorded (a folder from before writers were)
    dead_writer(attempts / "3")
    named = save(folder, 3, 3)
    Checkpoint.objects.create(run=run, step=3, path=str(named))  # what the run lists and serves
    dead_writer(attempts / "4")
    save(folder, 4, 4)
    assert run.finish(Run.Status.FAILED, error="stopped for the test")

    assert remove_ended_attempt_folders() == [attempts / "4"]
    assert sorted(p.name for p in attempts.iterdir()) == ["1", "2", "3"]
    assert (named / "model.safetensors").is_file()


def test_an_attempt_records_its_training_process_as_its_folders_writer_which_keeps_it_while_alive(make_run, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    run = claim(make_run().pk, "w")
    with Attempt(run.pk):
        pass  # nothing trained: the run ends failed, and this process (its writer) lives on
    writer = json.loads((run.folder() / "attempts" / "1" / WRITER_FILE).read_text())
    assert (writer["session"], writer["pid"]) == (os.getsid(0), os.getpid())
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert remove_ended_attempt_folders() == []
    assert (run.folder() / "attempts" / "1").is_dir()
