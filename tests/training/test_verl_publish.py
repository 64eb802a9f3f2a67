"""The verl backend's writes are fenced where they are made: its metrics bridge asks before it
forwards, and a checkpoint verl saves in the attempt's own folder is published into the run's only
while the attempt owns the run. verl's trainer cannot run here (CUDA GPUs, vLLM): verl's job is
``standins.verl_trainer``, a stand-in of its trainer loop that writes what verl writes (through
verl's own ``Tracking``) and asks nothing of ours; the rest is the verl backend's own code.

Ownership is a value the test changes (a takeover); both attempts ask the same function."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from standins.verl_trainer import StandInVerlJob
from standins.ownership import Ownership
from training import AgentTrainer
from training.backends.verl import backend as verl_backend
from training.errors import RunSuperseded
from training.tracking.sinks import MetricSink

STEPS = 4


@pytest.fixture(autouse=True)
def one_gpu(monkeypatch):
    monkeypatch.setattr(verl_backend, "cuda_device_count", lambda: 1)  # check_config composes for one GPU


class Recorded(MetricSink):
    def __init__(self) -> None:
        self.steps: list[int] = []
        self.checkpoints: list[int] = []

    def log_metrics(self, step: int, metrics: dict) -> None:
        self.steps.append(step)

    def log_episodes(self, step: int, episodes: list) -> None:
        pass

    def log_checkpoint(self, step: int, path) -> None:
        self.checkpoints.append(step)


def verl_processor(run_path: Path, attempt: int, ownership: Ownership, sink: Recorded, **config):
    trainer = AgentTrainer(
        backend="verl", train_dataset=[{"prompt": "x=", "ground_truth": "a"}], reward_func=lambda task, response: 1.0,
        run_path=str(run_path), sinks=[sink], attempt=attempt,
        may_write=ownership.may_write(attempt), write_fence=ownership.fence(attempt),
        config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 1,
                "trainer.total_training_steps": STEPS, "trainer.save_freq": 1, "trainer.max_checkpoints": 2, **config},
    )
    return trainer.train_processor


def published(run_path: Path) -> dict[str, str]:
    folder = run_path / "checkpoints"
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def until_published(run_path: Path):
    """``after_step`` that lets the stand-in go on once its step's checkpoint is in the run's folder
    (a real verl step outlasts the bridge's one-second poll; the stand-in's takes no time)."""
    def wait(step: int) -> None:
        for _ in range(300):
            if (run_path / "checkpoints" / f"global_step_{step}").is_dir():
                return
            threading.Event().wait(0.1)

    return wait


def test_each_checkpoint_verl_saves_in_the_attempts_folder_is_published_into_the_runs(tmp_path):
    sink = Recorded()
    processor = verl_processor(tmp_path, 1, Ownership(1), sink)
    assert processor.verl_config.trainer.default_local_dir == str((tmp_path / "attempts" / "1" / "checkpoints").resolve())
    job = StandInVerlJob(processor, after_step=until_published(tmp_path))
    result = processor.train_with(None, job.launch, job.end_job)

    assert result.steps == STEPS and not result.stopped and sink.steps == [1, 2, 3, 4]
    assert result.checkpoint == str(tmp_path / "checkpoints" / "global_step_4")
    # The run's list keeps trainer.max_checkpoints, with verl's marker naming the newest.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "global_step_3", "global_step_4", "latest_checkpointed_iteration.txt"]
    assert (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "4"
    assert sink.checkpoints == [1, 2, 3, 4]  # each published one reaches the sinks (an artifact store's uploader)

    # The next attempt resumes from the run's newest published checkpoint, not from its own empty folder.
    resumed = Recorded()
    processor = verl_processor(tmp_path, 2, Ownership(2), resumed, **{"trainer.total_training_steps": 6})
    assert processor.runtime_config().trainer.resume_from_path == str(tmp_path / "checkpoints" / "global_step_4")
    job = StandInVerlJob(processor)
    processor.train_with(None, job.launch, job.end_job)
    assert job.steps == [5, 6] and resumed.steps == [5, 6]
    assert "attempt 2" in (tmp_path / "checkpoints" / "global_step_6" / "actor" / "model.pt").read_text()


def test_a_checkpoint_published_while_verl_saves_the_next_one_is_whole(tmp_path):
    """verl removes the previous actor once the next is saved, before its marker moves: publishing in
    that moment (the bridge polls when it likes) must still find the marked checkpoint whole."""
    processor = verl_processor(tmp_path, 1, Ownership(1), Recorded())
    publisher = verl_backend.VerlCheckpointPublisher(processor, processor.verl_config.trainer.default_local_dir,
                                                     forwarded=lambda: STEPS)
    job = StandInVerlJob(processor, before_marker=lambda step: publisher.poll())
    processor.train_with(None, job.launch, job.end_job)

    steps = sorted((tmp_path / "checkpoints").glob("global_step_*"))
    assert [p.name for p in steps] == ["global_step_3", "global_step_4"]
    for folder in steps:
        assert (folder / "actor" / "model.pt").is_file(), f"{folder.name} was published without its actor"
        assert (folder / "actor" / "model.pt").read_text().startswith(f"weights of {folder.name.replace('global_', '').replace('_', ' ')},")


def test_a_checkpoint_is_published_only_once_its_steps_metrics_were_forwarded(tmp_path):
    """verl saves a step's checkpoint before it logs the step's metrics. Published in between, an
    attempt lost right then would leave the next one resuming after a step whose metrics nobody
    stored: the publisher waits until the bridge has forwarded the step."""
    processor = verl_processor(tmp_path, 1, Ownership(1), Recorded())
    written = Path(processor.verl_config.trainer.default_local_dir)
    (written / "global_step_2" / "actor").mkdir(parents=True)
    (written / "global_step_2" / "actor" / "model.pt").write_text("weights of step 2")
    (written / "latest_checkpointed_iteration.txt").write_text("2")  # saved; its metrics line not written yet
    forwarded = {"step": 1}
    publisher = verl_backend.VerlCheckpointPublisher(processor, written, forwarded=lambda: forwarded["step"])

    publisher.poll()
    assert not (tmp_path / "checkpoints" / "global_step_2").exists()
    forwarded["step"] = 2  # the bridge forwarded (and the sinks spooled) step 2
    publisher.poll()
    assert (tmp_path / "checkpoints" / "global_step_2" / "actor" / "model.pt").read_text() == "weights of step 2"
    assert (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "2"


@pytest.mark.slow  # an attempt frozen
def test_an_attempt_frozen_past_its_takeover_forwards_and_publishes_nothing_when_it_wakes(tmp_path):
    ownership = Ownership(1)
    frozen, thaw = threading.Event(), threading.Event()

    def freeze_after_step_2(step: int) -> None:
        if step == 2:
            frozen.set()
            thaw.wait(60)

    stale_sink = Recorded()
    # Long enough that, awake, it would go on for seconds: its job must be ended, not run out.
    stale = verl_processor(tmp_path, 1, ownership, stale_sink, **{"trainer.total_training_steps": 50})
    stale_job = StandInVerlJob(stale, step_seconds=0.2, after_step=freeze_after_step_2)
    outcome: dict = {}

    def train_stale() -> None:
        try:
            outcome["result"] = stale.train_with(None, stale_job.launch, stale_job.end_job)
        except BaseException as exc:  # noqa: BLE001 - what it ended with is the assertion
            outcome["error"] = exc

    thread = threading.Thread(target=train_stale)
    thread.start()
    assert frozen.wait(60)
    # Its bridge publishes what it saved before the freeze (steps 1 and 2).
    deadline = threading.Event()
    while "global_step_2" not in {p.name for p in (tmp_path / "checkpoints").glob("global_step_*")}:
        assert not deadline.wait(0.1) and thread.is_alive()

    ownership.holder = 2  # taken over while it is frozen; the second attempt finishes the run
    owner_sink = Recorded()
    owner = verl_processor(tmp_path, 2, ownership, owner_sink)
    owner_job = StandInVerlJob(owner, after_step=until_published(tmp_path))
    owner.train_with(None, owner_job.launch, owner_job.end_job)
    assert owner_job.steps == [3, 4] and owner_sink.steps == [3, 4]
    finished = published(tmp_path)
    assert set(finished) >= {"global_step_4/actor/model.pt", "latest_checkpointed_iteration.txt"}

    thaw.set()  # it wakes: verl goes on saving in the attempt's own folder; nothing of it reaches the run
    thread.join(60)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), RunSuperseded), outcome
    assert stale_job.ended.is_set() and stale_job.steps[-1] < 50  # its verl job was ended
    assert stale_sink.steps == [1, 2]  # nothing forwarded after the takeover
    assert published(tmp_path) == finished
    assert all("attempt 2" in (tmp_path / "checkpoints" / f"global_step_{step}" / "actor" / "model.pt").read_text()
               for step in (3, 4))
    # What the stale attempt's verl saved stays in its own folder.
    assert (tmp_path / "attempts" / "1" / "checkpoints" / "global_step_3").is_dir()
