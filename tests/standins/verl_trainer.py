"""A stand-in for verl's PPO trainer loop, for the verl backend's fencing on CPU (verl's trainer
needs CUDA GPUs and vLLM; neither is here).

Stand-in, not verl: no model is trained. What it keeps of verl is what our backend's hooks see of
verl's job, written the way verl writes it: each step its metrics through verl's own ``Tracking``
(the ``file`` backend, at ``VERL_FILE_LOGGER_PATH`` from the TaskRunner's environment), its
rollouts dumped to ``trainer.rollout_data_dir`` (``<step>.jsonl``), and every ``trainer.save_freq``
steps ``global_step_N`` (``actor/`` and ``data.pt``) saved in ``trainer.default_local_dir``, older
ones rotated (``trainer.max_actor_ckpt_to_keep``) and the marker file written last, as
``RayPPOTrainer._save_checkpoint`` does. It resumes as verl does (``trainer.resume_mode``,
``resume_from_path`` or the marker). It asks nothing of ours: it runs until its steps are done or
its job is ended (``end_job``, where the backend ``ray.kill``s verl's TaskRunner).

Everything else is the verl backend's own: the config it composes, ``VerlProcessor.train_with``,
its metrics bridge and checkpoint publisher. ``StandInVerlProcessor`` is the verl backend with this
loop in place of ``run_ppo`` and without its GPU check, registered as ``verl-standin`` on import
(a worker loads it through ``TRAINING_PLUGINS``).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

from training.backends.processor import available_processors, register_processor
from training.backends.verl.backend import VERL_LATEST, VerlProcessor, marked_step

# Tracking's file backend reads its path from the environment when it is built.
_ENVIRONMENT = threading.Lock()


class JobEnded(RuntimeError):
    """What ``run_ppo`` raises once its TaskRunner actor was killed (Ray's ActorDiedError)."""


class StandInVerlJob:
    """``launch(runner)`` and ``end_job(runner)`` for ``VerlProcessor.train_with``.

    ``step_seconds``: how long each step takes. ``after_step(step)``: called after each step's
    writes (a test freezes the loop there). ``before_marker(step)``: called while a checkpoint is
    saved and rotated but its marker still names the one before (a test publishes there)."""

    def __init__(self, processor: VerlProcessor, step_seconds: float = 0.0,
                 after_step: Callable[[int], None] | None = None,
                 before_marker: Callable[[int], None] | None = None) -> None:
        self.processor = processor
        self.step_seconds = step_seconds
        self.after_step = after_step
        self.before_marker = before_marker
        self.ended = threading.Event()
        self.steps: list[int] = []

    def launch(self, runner: Any) -> None:
        from verl.utils.tracking import Tracking  # verl is optional: imported where the job runs, as the backend does

        runner.handle = self  # run_ppo starts the TaskRunner actor: from now on the job can be ended
        verl = self.processor.runtime_config()
        trainer = verl.trainer
        with _ENVIRONMENT:
            saved = os.environ.get("VERL_FILE_LOGGER_PATH")
            os.environ["VERL_FILE_LOGGER_PATH"] = runner.env_vars["VERL_FILE_LOGGER_PATH"]
            try:
                tracking = Tracking(project_name=trainer.project_name, experiment_name=trainer.experiment_name,
                                    default_backend=["file"])
            finally:
                if saved is None:
                    os.environ.pop("VERL_FILE_LOGGER_PATH", None)
                else:
                    os.environ["VERL_FILE_LOGGER_PATH"] = saved
        start = self._resumed_step(trainer)
        checkpoints = Path(trainer.default_local_dir)
        rollouts = Path(trainer.rollout_data_dir)
        rollouts.mkdir(parents=True, exist_ok=True)
        saved_steps: list[int] = []
        for step in range(start + 1, trainer.total_training_steps + 1):
            if self.ended.wait(self.step_seconds):
                raise JobEnded("The actor died unexpectedly before finishing this task (stand-in).")
            tracking.log({"critic/score/mean": step / 100, "actor/pg_loss": -step / 10, "timing_s/step": self.step_seconds},
                         step=step)
            (rollouts / f"{step}.jsonl").write_text(
                json.dumps({"input": "x=", "output": "a", "gts": "a", "score": 1.0, "step": step}) + "\n")
            if trainer.save_freq > 0 and step % trainer.save_freq == 0:
                self._save(checkpoints, step, saved_steps, trainer.get("max_actor_ckpt_to_keep"))
            self.steps.append(step)
            if self.after_step is not None:
                self.after_step(step)
        tracking.finish()

    def end_job(self, runner: Any) -> None:
        self.ended.set()

    def _resumed_step(self, trainer: Any) -> int:
        if trainer.resume_mode == "resume_path":
            return int(str(trainer.resume_from_path).split("global_step_")[-1])
        if trainer.resume_mode == "auto":
            return marked_step(trainer.default_local_dir) or 0
        return 0

    def _save(self, checkpoints: Path, step: int, saved_steps: list[int], keep: int | None) -> None:
        """verl 0.9.1's order: its checkpoint manager makes room before the save (keeping keep - 1
        when keep > 1: ``ensure_checkpoint_capacity``), saves the actor, then rotates out what is
        beyond keep (``register_checkpoint``); the trainer saves the dataloader and writes the
        marker last. So with keep = 1 the marked checkpoint's actor is gone before the marker moves."""
        if keep and keep > 1 and len(saved_steps) >= keep:
            self._remove(checkpoints, saved_steps, keep - 1)
        folder = checkpoints / f"global_step_{step}"
        (folder / "actor").mkdir(parents=True, exist_ok=True)
        (folder / "actor" / "model.pt").write_text(f"weights of step {step}, attempt {self.processor.attempt}, pid {os.getpid()}\n")
        saved_steps.append(step)
        if keep and len(saved_steps) > keep:
            self._remove(checkpoints, saved_steps, keep)
        (folder / "data.pt").write_text(f"dataloader after step {step}\n")
        if self.before_marker is not None:
            self.before_marker(step)
        (checkpoints / VERL_LATEST).write_text(str(step))

    @staticmethod
    def _remove(checkpoints: Path, saved_steps: list[int], keep: int) -> None:
        for old in saved_steps[:-keep]:
            shutil.rmtree(checkpoints / f"global_step_{old}" / "actor", ignore_errors=True)
        del saved_steps[:-keep]


class StandInVerlProcessor(VerlProcessor):
    """The verl backend training with ``StandInVerlJob`` instead of ``run_ppo`` (and no GPU check)."""

    name = "verl-standin"
    step_seconds = float(os.environ.get("VERL_STANDIN_STEP_SECONDS", "0.5"))

    @classmethod
    def environment_status(cls, config: Any = None) -> dict[str, str | None]:
        return {"environment": None, "credentials": None}

    def check_backend(self, config: Any) -> None:
        self._refuse_declared_multi_trajectory_workflow()

    def train(self):
        job = StandInVerlJob(self, step_seconds=self.step_seconds)
        return self.train_with(None, job.launch, job.end_job)


if "verl-standin" not in available_processors():
    register_processor("verl-standin", StandInVerlProcessor)
