"""A training process's reports wait in a spool in the run's folder until they are stored: a
Postgres outage (cut by a TCP proxy) keeps them on disk, not in memory, and they are all written
when it is back; what a killed process reported but never stored is written by the next attempt;
and a spooled batch written twice stores each point and log line once."""

from __future__ import annotations

import shutil

import pytest
from django.db import OperationalError, connection

from tcp_proxy import TcpProxy
from webapp.dashboard import series
from webapp.dashboard.models import EpisodeSample
from webapp.dashboard.recording import DashboardSink
from webapp.runs.models import Run, RunLog
from webapp.runs.recording import RunRecorder

pytestmark = pytest.mark.django_db(transaction=True)


def segments(folder) -> list:
    return sorted((folder / "spool").glob("*.jsonl"))


def test_reports_of_a_killed_process_are_written_by_the_next_attempt_once(make_run, tmp_path):
    run = make_run()
    # The first attempt reports steps 1-3 and is killed before its writer stores them (never flushed).
    first = RunRecorder(run.pk, spool_dir=tmp_path)
    first_dashboard = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=tmp_path)
    for step in (1, 2, 3):
        first_dashboard.log_metrics(step, {"reward": step / 10})
        first.add_log("INFO", f"step {step}")
    first_dashboard.log_episodes(3, [{"reward": 0.3, "num_turns": 1, "termination_reason": "done", "task": {"x": 1}}])
    assert series.points_after(run.pk, -1) == {} and len(segments(tmp_path)) == 2

    # The next attempt writes them before its own, and the segments are gone once stored.
    kept = tmp_path / "kept"
    shutil.copytree(tmp_path / "spool", kept)
    second = RunRecorder(run.pk, spool_dir=tmp_path)
    second_dashboard = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=tmp_path)
    second_dashboard.log_metrics(4, {"reward": 0.4})
    second.close()
    second_dashboard.close()
    assert segments(tmp_path) == []
    assert series.points_after(run.pk, 0)["reward"] == [[1, 0.1], [2, 0.2], [3, 0.3], [4, 0.4]]
    assert EpisodeSample.objects.filter(run=run, step=3).count() == 1
    assert Run.objects.get(pk=run.pk).steps == 4

    # A process killed after storing a batch but before deleting its segment: written again, stored once.
    for path in kept.iterdir():
        shutil.copy(path, tmp_path / "spool" / path.name)
    third = RunRecorder(run.pk, spool_dir=tmp_path)
    third_dashboard = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=tmp_path)
    third.close()
    third_dashboard.close()
    assert list(RunLog.objects.filter(run=run).values_list("message", flat=True)) == ["step 1", "step 2", "step 3"]
    assert [s for s, _ in series.points_after(run.pk, 0)["reward"]] == [1, 2, 3, 4]
    assert EpisodeSample.objects.filter(run=run).count() == 1


def test_what_a_spool_holds_comes_back_exactly_an_integer_past_64_bits_too(make_run, tmp_path):
    # Spooled lines are read by orjson, which reads an integer past 64 bits as a float; such a record
    # is written by json, and read back by json.
    run = make_run()
    answer = 2**70 + 1
    killed = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=tmp_path)
    killed.log_episodes(1, [{"reward": 0.5, "num_turns": 1, "termination_reason": "done", "task": {"answer": answer}}])
    killed.log_episodes(2, [{"reward": 0.25, "num_turns": 1, "termination_reason": "done", "task": {"answer": 7}}])
    DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=tmp_path).close()  # the next attempt stores them
    stored = {sample.step: sample.data["task"]["answer"] for sample in EpisodeSample.objects.filter(run=run)}
    assert stored == {1: answer, 2: 7} and type(stored[1]) is int


def test_segments_a_superseded_attempt_wrote_after_its_takeover_are_never_replayed(make_run, tmp_path):
    """Segments carry their attempt. An attempt adopts what earlier ones left (a lost attempt's
    reports are still stored); what a superseded attempt wrote after the takeover (a process paused
    past it, killed by its supervisor before it could delete its segments) is deleted by the next
    attempt resuming in the folder, not stored."""
    run = make_run()
    first = RunRecorder(run.pk, spool_dir=tmp_path, attempt=1)
    first.add_log("INFO", "attempt 1, before the takeover")  # never stored: its machine looked lost
    second = RunRecorder(run.pk, spool_dir=tmp_path, attempt=2)  # takes the run over in the same folder
    first.spool.seal()
    first.add_log("INFO", "attempt 1, after the takeover")  # the paused process woke up
    second.add_log("INFO", "attempt 2")
    assert sorted(p.name.rsplit("-", 1)[1] for p in segments(tmp_path)) == ["a1.jsonl", "a2.jsonl", "a2.jsonl"]
    # Both killed now, before anything was stored; the run is re-queued into the same folder.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, attempts=3)
    third = RunRecorder(run.pk, spool_dir=tmp_path, attempt=3)
    third.add_log("INFO", "attempt 3")
    third.close()
    assert list(RunLog.objects.filter(run=run).values_list("message", flat=True)) == [
        "attempt 1, before the takeover", "attempt 2", "attempt 3"]
    assert segments(tmp_path) == []


def test_a_postgres_outage_keeps_reports_on_disk_and_writes_them_all_when_it_is_back(make_run, tmp_path):
    run = make_run()
    db = connection.settings_dict
    proxy = TcpProxy(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    recorder = RunRecorder(run.pk, spool_dir=tmp_path)  # not started: this thread flushes
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=tmp_path)  # flushed by this thread too
    original = dict(db)
    connection.close()
    db.update(HOST="127.0.0.1", PORT=str(proxy.port))  # this thread's connection goes through the proxy
    try:
        sink.log_metrics(1, {"reward": 0.1})
        sink.flush()
        proxy.cut()
        for step in range(2, 7):
            sink.log_metrics(step, {"reward": step / 10})
            recorder.add_log("INFO", f"step {step}")
            for writer in (sink, recorder):
                with pytest.raises(OperationalError):
                    writer.flush()
        # Nothing of the outage is held in memory: five segments of each writer wait on disk.
        assert sink._steps == [] and recorder._logs == []
        assert len(segments(tmp_path)) == 10
        proxy.restore()
        connection.close()
        sink.log_metrics(7, {"reward": 0.7})
        sink.flush()
        recorder.flush()
    finally:
        connection.close()
        db.clear()
        db.update(original)
        proxy.close()
    assert segments(tmp_path) == []
    sink.close()
    assert [s for s, _ in series.points_after(run.pk, -1)["reward"]] == list(range(1, 8))
    assert list(RunLog.objects.filter(run=run).values_list("message", flat=True)) == [f"step {s}" for s in range(2, 7)]


def test_a_full_spool_drops_reports_and_says_how_many(make_run, tmp_path, settings):
    settings.RUN_SPOOL_MAX_MB = 1
    run = make_run()
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=tmp_path)
    big = {f"metric_{i:04d}": float(i) for i in range(2000)}  # about 50 kB a step
    for step in range(1, 41):
        sink.log_metrics(step, big)
    sink.close()
    stored = len(series.points_after(run.pk, -1)["metric_0000"])
    assert 0 < stored < 40
    dropped = RunLog.objects.get(run=run, level="ERROR").message
    assert dropped.startswith(f"{(40 - stored) * 2000} metric point(s) were dropped")


def test_the_first_drop_notice_survives_a_failed_write(make_run, tmp_path, settings, monkeypatch):
    settings.RUN_SPOOL_MAX_MB = 1
    run = make_run()
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=tmp_path)
    big = {f"metric_{i:04d}": float(i) for i in range(2000)}
    for step in range(1, 41):
        sink.log_metrics(step, big)
    assert sink.dropped > 0
    write_steps = series.SeriesWriter.write_steps
    calls = []

    def down_once(self, logged):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("the database is away")
        return write_steps(self, logged)

    monkeypatch.setattr(series.SeriesWriter, "write_steps", down_once)
    with pytest.raises(OperationalError):  # the batch with the first drop notice: its points wait in the spool
        sink.flush()
    sink.close()
    told = sum(int(m.split()[0]) for m in RunLog.objects.filter(run=run, level="ERROR").values_list("message", flat=True))
    assert told == sink.dropped


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MB filesystem (tmpfs), mounted for the test."""
    import subprocess

    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    yield folder
    # Lazily: a writer thread the test left may still hold a file there; the mount must not outlive the test.
    subprocess.run(["umount", "--lazy", str(folder)], check=False)


def test_a_spool_on_a_full_disk_reports_its_drops_and_training_goes_on(make_run, full_disk):
    run = make_run()
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=full_disk)  # far under RUN_SPOOL_MAX_MB
    recorder = RunRecorder(run.pk, spool_dir=full_disk)
    big = {f"metric_{i:04d}": float(i) for i in range(2000)}  # about 50 kB a step: the disk is full after ~20
    for step in range(1, 41):
        sink.log_metrics(step, big)  # never raises: training goes on
        recorder.add_log("INFO", f"step {step}")
    sink.close()
    recorder.close()
    stored = len(series.points_after(run.pk, -1)["metric_0000"])
    assert 0 < stored < 40 and sink.dropped == (40 - stored) * 2000
    errors = list(RunLog.objects.filter(run=run, level="ERROR").values_list("message", flat=True))
    assert any(m.startswith(f"{sink.dropped} metric point(s) were dropped") and "No space left on device" in m for m in errors), errors
    # Small log lines may still fit where a step's points did not: each is stored or told.
    told_lines = sum(int(m.split()[0]) for m in errors if "log line(s) were dropped" in m and "No space left on device" in m)
    assert RunLog.objects.filter(run=run, level="INFO").count() + told_lines == 40
    assert series.points_after(run.pk, -1)["overload/dropped_points"][-1][1] == sink.dropped  # charted on the run page


def fill(folder) -> "Path":
    """Fill ``folder``'s disk up to the last byte; deleting the returned file gives the room back."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def test_under_the_pause_setting_a_full_disk_pauses_training_until_it_has_room_told_once(make_run, full_disk, settings):
    import threading

    settings.RUN_ON_FULL_DISK = "pause"
    settings.RUN_FULL_DISK_CHECK_SECONDS = 1
    run = make_run()
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=full_disk)
    filler = fill(full_disk)
    metrics = {f"metric_{i:02d}": float(i) for i in range(50)}
    training = threading.Thread(target=lambda: [sink.log_metrics(step, metrics) for step in range(1, 6)], daemon=True)
    training.start()
    training.join(timeout=3)
    assert training.is_alive()  # paused at its first report, nothing dropped
    told = list(RunLog.objects.filter(run=run).values_list("level", "message"))
    assert len(told) == 1 and told[0][0] == "ERROR", told
    assert f"The disk of {full_disk / 'spool'} is full" in told[0][1] and "training is paused" in told[0][1]
    filler.unlink()
    training.join(timeout=15)
    assert not training.is_alive()
    sink.close()
    assert sink.dropped == 0
    assert [s for s, _ in series.points_after(run.pk, -1)["metric_00"]] == [1, 2, 3, 4, 5]
    messages = list(RunLog.objects.filter(run=run).values_list("message", flat=True))
    assert len(messages) == 2 and "accepts writes again" in messages[1]


def disk_filling_writer(folder):
    def write():
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "model.safetensors", "wb") as handle:
            handle.write(b"\0" * (2 << 20))  # 2 MB: more than the whole disk
        return "written"

    return write


def test_a_checkpoint_that_does_not_fit_fails_naming_the_folder_and_free_space_or_waits_under_pause(full_disk, tmp_path):
    import threading

    from training import AgentTrainer
    from training.errors import DiskFull

    processor = AgentTrainer(train_dataset=[{"prompt": "ab"}] * 4, reward_func=lambda task, response: 0.0, backend="trl", run_path=str(tmp_path),
                             config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4}).train_processor
    folder = full_disk / "checkpoints" / "checkpoint-3"
    with pytest.raises(DiskFull, match=rf"the checkpoint of step 3 did not fit in {folder} \([0-9.]+ MB free on its disk\)"):
        processor.write_files("the checkpoint of step 3", folder, disk_filling_writer(folder))
    assert not folder.exists()  # no torn checkpoint for a resume to pick

    processor.on_full_disk, processor.full_disk_check_seconds = "pause", 0.2
    filler = fill(full_disk)
    small = full_disk / "checkpoints" / "checkpoint-4"
    done = []

    def write_small():
        small.mkdir(parents=True, exist_ok=True)
        (small / "state.json").write_bytes(b"\0" * 100_000)
        done.append(1)

    saving = threading.Thread(target=lambda: processor.write_files("the checkpoint of step 4", small, write_small), daemon=True)
    saving.start()
    saving.join(timeout=2)
    assert saving.is_alive() and not done  # waits for room
    filler.unlink()
    saving.join(timeout=10)
    assert done and (small / "state.json").stat().st_size == 100_000
