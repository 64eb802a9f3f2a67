"""The run folder's episode store (``ParquetEpisodeSink``) writes Parquet from a process of its own,
and loses no step it was handed: not when its writer is killed, not when the training process is."""

import os
import signal

import psutil
import pytest

from training.tracking import episodes
from training.tracking.episodes import PENDING, ParquetEpisodeSink, read_run_folder


def records(step: int, count: int = 3, split: str = "train") -> list[dict]:
    return [{"split": split, "step": step, "position": p, "group": "g", "group_position": p, "token_ids": [1, 2, 3],
             "mask": [1, 1, 0], "reward": float(p), "prompt": "q", "turns": [], "reward_components": {"score": 0.0}}
            for p in range(count)]


def killed_writer(sink: ParquetEpisodeSink) -> None:
    os.kill(sink._pid, signal.SIGKILL)
    os.waitpid(sink._pid, 0)
    sink._pid = None  # reaped here: close() must not wait on it


def test_the_parquet_is_made_by_a_process_of_its_own(tmp_path, monkeypatch):
    sink = ParquetEpisodeSink(tmp_path)
    assert sink._pid in [child.pid for child in psutil.Process().children()]
    # This process can no longer make Parquet; the writer, forked before, still can.
    monkeypatch.setattr(episodes, "to_parquet", lambda part: pytest.fail("Parquet made in the training process"))
    sink.store_episodes(1, records(1))
    sink.store_episodes(2, records(2) + records(2, 1, split="val"))
    sink.close()
    assert [(r["step"], r["position"], r["token_ids"]) for r in read_run_folder(tmp_path)] == [
        (1, 0, [1, 2, 3]), (1, 1, [1, 2, 3]), (1, 2, [1, 2, 3]), (2, 0, [1, 2, 3]), (2, 1, [1, 2, 3]), (2, 2, [1, 2, 3])]
    assert [r["split"] for r in read_run_folder(tmp_path, "val")] == ["val"]
    with pytest.raises(ChildProcessError):  # the writer has ended and close() reaped it
        os.waitpid(sink._pid, os.WNOHANG)
    assert not (tmp_path / "episodes" / PENDING).exists()


def test_steps_handed_to_a_killed_writer_are_written_at_close(tmp_path):
    sink = ParquetEpisodeSink(tmp_path)
    killed_writer(sink)
    sink.store_episodes(1, records(1))
    assert read_run_folder(tmp_path) == []
    sink.close()
    assert [r["step"] for r in read_run_folder(tmp_path)] == [1, 1, 1]


def test_what_a_killed_training_process_handed_over_is_written_by_the_next_sink_on_the_run_folder(tmp_path):
    first = ParquetEpisodeSink(tmp_path)
    killed_writer(first)
    first.store_episodes(1, records(1, count=2))  # and the training process dies: no close()
    second = ParquetEpisodeSink(tmp_path)  # the run resumed
    second.store_episodes(2, records(2, count=1))
    second.close()
    assert [(r["step"], r["position"]) for r in read_run_folder(tmp_path)] == [(1, 0), (1, 1), (2, 0)]


def test_when_writing_falls_behind_the_newest_steps_are_dropped_and_counted(tmp_path):
    sink = ParquetEpisodeSink(tmp_path, max_pending=2)
    killed_writer(sink)  # nothing is written while training: the steps wait
    for step in (1, 2, 3, 4):
        sink.store_episodes(step, records(step, count=2))
    assert sink.dropped == 4
    sink.close()
    assert sorted({r["step"] for r in read_run_folder(tmp_path)}) == [1, 2]


def test_an_integer_past_64_bits_comes_back_as_it_was(tmp_path):
    sink = ParquetEpisodeSink(tmp_path)
    huge = records(1, count=1)
    huge[0]["reward_components"] = {"score": 0.0, "id": 2 ** 70}
    sink.store_episodes(1, huge)
    sink.close()
    assert read_run_folder(tmp_path)[0]["reward_components"]["id"] == 2 ** 70
