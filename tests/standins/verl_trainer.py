"""A stand-in for verl's PPO trainer loop, for the verl backend's fencing on CPU (verl's trainer
needs CUDA GPUs and vLLM; neither is here).

Stand-in, not verl: no model is trained. What it keeps of verl is what our backend's hooks see of
verl's job, written the way verl 0.9.1's default trainer (``trainer.use_v1``,
``verl.trainer.ppo.v1.trainer_base.PPOTrainer``) writes it: each step its metrics through verl's own
``Tracking`` (the ``file`` backend, at ``VERL_FILE_LOGGER_PATH`` from the TaskRunner's environment),
its rollouts dumped to ``trainer.rollout_data_dir`` (``<step>.jsonl``: ``data.train_batch_size``
prompts, ``rollout.n`` samples each, a ``uid`` per prompt, by the trainer class our TaskRunner
trains with, verl's own ``_log_rollout_data`` with our columns, see ``_dump_rollouts``; for our agent
loop each sample is made by the agent loop's own ``episode_to_output`` and ``add_episode_record``
from a scripted two-turn episode, for verl's single-turn loop as ``SingleTurnAgentLoop`` returns it
with ``acc`` as our ``compute_score`` returns it), its validation by verl's own ``PPOTrainer._validate``
of that trainer class (before the first step with ``trainer.val_before_train``, every
``trainer.test_freq`` steps and after the last: each row of ``data.val_files`` ``val_kwargs.n``
times, each batch put in verl's TransferQueue, sampled, read and cleared before the next, all
dumped to ``trainer.validation_data_dir`` at the end, sorted by key, with ``reward`` among the
extra values; see ``_validate``), and every ``trainer.save_freq``
steps ``global_step_N`` (``actor/`` and ``data.pt``) saved in ``trainer.default_local_dir``, older
ones rotated (``trainer.max_actor_ckpt_to_keep``) and the marker file written last, as
``_save_checkpoint`` does. It resumes as verl does (``trainer.resume_mode``,
``resume_from_path`` or the marker). It asks nothing of ours: it runs until its steps are done or
its job is ended (``end_job``, where the backend ``ray.kill``s verl's TaskRunner).

Everything else is the verl backend's own: the config it composes, ``VerlProcessor.train_with``,
its metrics bridge and checkpoint publisher. ``StandInVerlProcessor`` is the verl backend with this
loop in place of ``run_ppo`` and without its GPU check, registered as ``verl-standin`` on import
(a worker loads it through ``TRAINING_PLUGINS``).
"""

from __future__ import annotations

import os
import uuid
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from training.backends.processor import available_processors, register_processor
from training.backends.verl.backend import AGENT_LOOP_NAME, VERL_LATEST, VerlProcessor, marked_step
from training.rollouts.tiny import build_char_tokenizer
from training.types import Episode, Step, TerminationReason, Trajectory

# Tracking's file backend reads its path from the environment when it is built.
_ENVIRONMENT = threading.Lock()


class JobEnded(RuntimeError):
    """What ``run_ppo`` raises once its TaskRunner actor was killed (Ray's ActorDiedError)."""


class StandInVerlJob:
    """``launch(runner)`` and ``end_job(runner)`` for ``VerlProcessor.train_with``.

    ``step_seconds``: how long each step takes. ``after_step(step)``: called after each step's
    writes (a test freezes the loop there). ``before_marker(step)``: called while a checkpoint is
    saved and rotated but its marker still names the one before (a test publishes there).
    ``val_batch_size``: how many validation rows verl's dataloader batches together (verl's
    ``data.val_batch_size``, which our backend leaves unset: the whole validation file at once)."""

    def __init__(self, processor: VerlProcessor, step_seconds: float = 0.0,
                 after_step: Callable[[int], None] | None = None,
                 before_marker: Callable[[int], None] | None = None, val_batch_size: int | None = None) -> None:
        self.processor = processor
        self.val_batch_size = val_batch_size
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
        if trainer.val_before_train:  # PPOTrainer.fit: validation at the resumed step, logged at it
            tracking.log(self._validate(verl, start), step=start)
        for step in range(start + 1, trainer.total_training_steps + 1):
            if self.ended.wait(self.step_seconds):
                raise JobEnded("The actor died unexpectedly before finishing this task (stand-in).")
            # verl 0.9.1's order within a step (PPOTrainer.fit): the checkpoint is saved, the validation
            # dumped, then the rollouts, and only then the step's metrics (with the validation's) logged.
            if trainer.save_freq > 0 and step % trainer.save_freq == 0:
                self._save(checkpoints, step, saved_steps, trainer.get("max_actor_ckpt_to_keep"))
            metrics = {"critic/score/mean": step / 100, "actor/pg_loss": -step / 10, "timing_s/step": self.step_seconds}
            if trainer.test_freq > 0 and (step == trainer.total_training_steps or step % trainer.test_freq == 0):
                metrics.update(self._validate(verl, step))
            self._dump_rollouts(verl, rollouts, step)
            tracking.log(metrics, step=step)
            self.steps.append(step)
            if self.after_step is not None:
                self.after_step(step)
        tracking.finish()

    def _dump_rollouts(self, verl: Any, rollouts: Path, step: int) -> None:
        """A step's training dump as verl 0.9.1's default trainer (``trainer.use_v1``) writes it:
        each sample put in verl's TransferQueue as ``AgentLoopWorkerTQ`` puts it (its
        ``AgentLoopOutput.as_dict()`` with the prompt's fields, keyed ``<uid>_<session>_0``), then
        the dump written by the trainer class our TaskRunner trains with
        (``training.backends.verl.dumps.dumping_trainer`` of verl's ``sync`` trainer): verl's own
        ``_log_rollout_data`` reading the TransferQueue, our columns added. TransferQueue needs Ray
        (``_TransferQueue`` stands in for it). The uids are verl's random ones, drawn in sorted order,
        so verl's dump (sorted by key) keeps the prompts' order."""
        from transfer_queue import KVBatchMeta  # verl is optional: imported where the job runs, as the backend does
        from verl.trainer.ppo.v1 import trainer_base

        from training.backends.verl.dumps import dumping_trainer

        prompts, n = int(verl.data.train_batch_size), int(verl.actor_rollout_ref.rollout.n)
        samples: dict[str, dict[str, Any]] = {}
        for prompt, uid in enumerate(sorted(str(uuid.uuid4()) for _ in range(prompts))):
            for sample in range(n):
                reward = float((step + prompt + sample) % 2)
                output = _sample_output(verl, step, prompt, sample, uid, reward)
                field = output.as_dict()
                field.update(uid=uid, session_id=sample, data_source="guess", global_steps=step,
                             extra_info={"index": prompt, "split": "train"}, reward_model={"ground_truth": "a"})
                field["loss_mask"] = field["response_mask"]
                samples[f"{uid}_{sample}_0"] = field
        trainer = object.__new__(dumping_trainer(trainer_base.get_trainer_cls(verl.trainer.v1.trainer_mode)))
        trainer.tokenizer, trainer.global_steps = _tokenizer(), step
        trainer._init_dump_executor()
        keys = list(samples)[::-1]  # as the replay buffer hands them: not in verl's dump order
        with _TransferQueue(samples):
            trainer._log_rollout_data(KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train"), {},
                                      str(rollouts))
        trainer._shutdown_dump_executor()

    def _validate(self, verl: Any, step: int) -> dict[str, float]:
        """verl's validation (``PPOTrainer._validate`` of the trainer class our TaskRunner trains
        with, verl's own code): ``data.val_files``'s rows, as verl's dataloader batches them
        (``val_batch_size``, all by default), each batch's prompts put in verl's TransferQueue
        and generated ``val_kwargs.n`` times (``_ValidationRollouts``), sampled by the replay buffer
        (``_ValidationReplayBuffer``), read and cleared from the TransferQueue before the next batch,
        and, where ``trainer.validation_data_dir`` names a folder, every batch dumped at the end
        sorted by key (``uid``), the scores again as ``reward`` among the extra values. Each row's
        sample is "go<row>>" answered as a training sample is (``_sample_output``); reward: 1 for
        even rows. The rewards are the agent loop's (no colocated reward model)."""
        import pyarrow.parquet as pq
        import torch
        from verl.trainer.ppo.v1 import trainer_base
        from verl.utils.dataset.rl_dataset import collate_fn

        from training.backends.verl.dumps import dumping_trainer

        rows = pq.read_table(str(verl.data.val_files)).to_pylist()
        size = int(self.val_batch_size or verl.data.get("val_batch_size") or len(rows))
        dataset = [{"raw_prompt": [{"role": "user", "content": f"go{index}>"}],
                    "dummy_tensor": torch.tensor([0], dtype=torch.uint8), "data_source": "guess",
                    "reward_model": row["reward_model"], "extra_info": {"index": index, "split": "test"}}
                   for index, row in enumerate(rows)]
        trainer = object.__new__(dumping_trainer(trainer_base.get_trainer_cls(verl.trainer.v1.trainer_mode)))
        trainer.config, trainer.tokenizer, trainer.global_steps = verl, _tokenizer(), step
        trainer.val_dataloader = [collate_fn(dataset[i:i + size]) for i in range(0, len(dataset), size)]
        samples: dict[str, dict[str, Any]] = {}
        trainer.agent_loop_manager = _ValidationRollouts(verl, samples)
        trainer.replay_buffer = _ValidationReplayBuffer(samples)
        trainer.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=[])
        trainer._init_dump_executor()
        with _TransferQueue(samples):
            metrics = trainer._validate()
        trainer._shutdown_dump_executor()
        assert not samples, "verl's validation clears every batch it read"
        return metrics

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


# The times the turn loop measures, as the stand-in's scripted turns carry them (model, environment).
TURN_SECONDS = ((0.25, 0.5), (0.125, 0.0625))
# verl's time generating a sample of its own single-turn loop, as the stand-in's samples carry it.
SINGLE_TURN_SECONDS = 0.375


def _sample_output(verl: Any, step: int, prompt: int, sample: int, uid: str, reward: float):
    """One sample's ``AgentLoopOutput``: our agent loop's (``_agent_loop_output``) or, without an
    agent class, what verl's ``SingleTurnAgentLoop`` returns for prompt "go<prompt>>" and reply
    "a" (ending with EOS), with the rollout's log-probabilities where verl computes them
    (``rollout.calculate_log_probs``) and the reward function's ``acc``, as verl scores it."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    if verl.actor_rollout_ref.rollout.agent.default_agent_loop == AGENT_LOOP_NAME:
        return _agent_loop_output(verl, step, prompt, sample, uid, reward)
    tokenizer = _tokenizer()
    response = tokenizer.encode("a", add_special_tokens=False) + [tokenizer.eos_token_id]
    logprobs = [-0.5, -0.25] if verl.actor_rollout_ref.rollout.calculate_log_probs else None
    return AgentLoopOutput(
        prompt_ids=tokenizer.encode(f"go{prompt}>", add_special_tokens=False), response_ids=response,
        response_mask=[1] * len(response), response_logprobs=logprobs, reward_score=reward, num_turns=2,
        metrics=AgentLoopMetrics(generate_sequences=SINGLE_TURN_SECONDS), extra_fields={"reward_extra_info": {"acc": reward}},
    )


def _agent_loop_output(verl: Any, step: int, prompt: int, sample: int, uid: str, reward: float):
    """What our agent loop hands verl for a two-turn episode (model "a", environment "no>", model
    "b"), through the agent loop's own functions, its ``reward_extra_info`` with the record."""
    from training.backends.verl.agent_loop import add_episode_record, episode_to_output

    tokenizer = _tokenizer()
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    (first_model, first_env), (second_model, second_env) = TURN_SECONDS
    first, second = Step(chat_completions=[{"role": "user", "content": f"go{prompt}>"}], model_response="a", reward=0.0,
                         info={"generation_seconds": first_model, "env_seconds": first_env}), \
        Step(chat_completions=[{"role": "user", "content": f"go{prompt}>"}, {"role": "assistant", "content": "a"},
                               {"role": "user", "content": "no>"}], model_response="b", reward=reward, done=True,
             info={"generation_seconds": second_model, "env_seconds": second_env})
    response = encode("a") + encode("no>") + encode("b")
    episode = Episode(
        task={"prompt": f"go{prompt}>", "data_source": "guess"}, trajectories=[Trajectory(steps=[first, second], reward=reward)],
        is_correct=reward == 1.0, termination_reason=TerminationReason.ENV_DONE,
        info={"reward_components": {"format": 0.5, "answer": reward}},
        prompt_ids=encode(f"go{prompt}>"), response_ids=response, response_mask=[1, 0, 0, 0, 1],
        response_logprobs=[-0.5, 0.0, 0.0, 0.0, -0.25],
    )
    generated = first_model + second_model
    output = episode_to_output(episode, int(verl.data.max_response_length), tokenizer.eos_token_id,
                               generated, generated + first_env + second_env)
    add_episode_record(output, episode, tokenizer, {"uid": uid, "data_source": "guess", "extra_info": {"index": prompt}})
    return output


class _ValidationRollouts:
    """verl's agent loop manager (``AgentLoopManagerTQ``) in validation: ``generate_sequences`` of
    a batch of prompts puts each prompt's ``val_kwargs.n`` samples in the TransferQueue (``samples``)
    as ``AgentLoopWorkerTQ`` puts them, keyed ``<uid>_<session>_0``, the prompt's fields with them."""

    def __init__(self, verl: Any, samples: dict[str, dict[str, Any]]) -> None:
        self.verl, self.samples = verl, samples

    def generate_sequences(self, batch: Any) -> None:
        n = int(self.verl.actor_rollout_ref.rollout.val_kwargs.n)
        step = batch["global_steps"]
        for i in range(len(batch)):
            prompt = {name: batch[name][i] for name in ("uid", "data_source", "extra_info", "reward_model", "raw_prompt")}
            row = int(prompt["extra_info"]["index"])
            for session in range(n):
                field = _sample_output(self.verl, step, row, session, prompt["uid"], float(row % 2 == 0)).as_dict()
                field.update(prompt, session_id=session, global_steps=step)
                field["loss_mask"] = field["response_mask"]
                self.samples[f"{prompt['uid']}_{session}_0"] = field


class _ValidationReplayBuffer:
    """verl's replay buffer in validation: ``sample`` hands out every sample put in the TransferQueue
    and not handed out yet (verl's waits until each prompt's are all there), in another order than
    verl dumps them."""

    def __init__(self, samples: dict[str, dict[str, Any]]) -> None:
        self.samples, self.handed = samples, set()

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        from transfer_queue import KVBatchMeta

        keys = [key for key in self.samples if key not in self.handed][::-1]
        self.handed.update(keys)
        return KVBatchMeta(keys=keys, tags=[{"status": "success"} for _ in keys], partition_id=partition_id), {}


class _TransferQueue:
    """verl's TransferQueue (``transfer_queue``, which needs Ray) for the stand-in's dumps, while
    in use: ``kv_batch_get`` of the samples given, answered as TransferQueue answers, a tensor
    field as one jagged nested tensor (a row per sample), any other as a ``NonTensorStack``; a
    field a sample lacks is left out. ``kv_batch_put`` of tags only (verl's prompt markers) keeps
    nothing; ``kv_clear`` removes the samples. One at a time (a process may run several stand-in
    jobs)."""

    _lock = threading.Lock()

    def __init__(self, samples: dict[str, dict[str, Any]]) -> None:
        self.samples = samples

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str] | str | None = None):
        import torch
        from tensordict import NonTensorStack, TensorDict

        rows = [self.samples[key] for key in keys]
        fields = [select_fields] if isinstance(select_fields, str) else select_fields or list(rows[0])
        data = {}
        for name in fields:
            if not all(name in row for row in rows):
                continue
            values = [row[name] for row in rows]
            if all(isinstance(value, torch.Tensor) for value in values):
                data[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            else:
                data[name] = NonTensorStack(*values)
        return TensorDict(data, batch_size=[len(rows)])

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: list[dict] | None = None):
        assert fields is None, "the stand-in's samples are put by its rollouts"

    def kv_clear(self, keys: list[str] | str, partition_id: str) -> None:
        for key in [keys] if isinstance(keys, str) else keys:
            self.samples.pop(key, None)

    _CALLS = ("kv_batch_get", "kv_batch_put", "kv_clear")

    def __enter__(self) -> "_TransferQueue":
        import transfer_queue

        self._lock.acquire()
        self._saved = {name: getattr(transfer_queue, name) for name in self._CALLS}
        for name in self._CALLS:
            setattr(transfer_queue, name, getattr(self, name))
        return self

    def __exit__(self, *exc: Any) -> None:
        import transfer_queue

        for name, saved in self._saved.items():
            setattr(transfer_queue, name, saved)
        self._lock.release()


_TOKENIZERS: list = []


def _tokenizer():
    if not _TOKENIZERS:
        _TOKENIZERS.append(build_char_tokenizer())
    return _TOKENIZERS[0]


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
