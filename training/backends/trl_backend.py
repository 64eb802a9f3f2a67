"""The ``trl`` backend: TRL's GRPOTrainer on a CPU or one GPU.

Single-turn tasks use TRL's own generation. Multi-turn agents, workflows and black-box
functions run in our rollout engine, handed to TRL through ``rollout_func``: it returns the
token ids of each episode with ``env_mask`` (0 for environment tokens), so TRL trains only on
what the model produced.

Step semantics: one training step is one optimizer step of TRL (``trainer.total_training_steps``
maps to ``max_steps``); with the defaults each step generates ``data.train_batch_size`` prompts x
``actor_rollout_ref.rollout.n`` episodes.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Any

from training.backends.base import BuiltinProcessor, TrainResult
from training.config import Config
from training.data import dataset_to_tasks
from training.log import logger
from training.outcomes import OutcomeMonitor, TooManyEpisodeErrors
from training.types import RewardOutput
from training.validation import evaluate, validation_tasks

# Stable metric names: what TRL logs -> what our sinks and the dashboard show.
TRL_METRIC_NAMES = {
    "reward": "reward",
    "reward_std": "reward_std",
    "loss": "loss",
    "kl": "kl",
    "entropy": "entropy",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "completions/mean_length": "response_length",
    "completions/clipped_ratio": "clipped_ratio",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "clip_ratio/region_mean": "clip_ratio",
    "num_tokens": "num_tokens",
    "epoch": "epoch",
    "dropped_groups": "dropped_groups",
}
SAMPLE_EPISODES_PER_STEP = 4
# A column added to single-turn datasets so a failing reward can name its row.
ROW_COLUMN = "__row__"


class TRLProcessor(BuiltinProcessor):
    name = "trl"

    @classmethod
    def environment_status(cls, config: Any = None) -> dict[str, str | None]:
        from training.utils import is_trl_available

        return {"environment": None if is_trl_available() else "TRL is not installed", "credentials": None}

    def check_backend(self, config: Config) -> None:
        import torch

        if config.trainer.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("trainer.device: 'cuda' was asked for but this machine has no CUDA GPU; use auto or cpu.")
        if config.actor_rollout_ref.rollout.n < 2:
            raise ValueError("actor_rollout_ref.rollout.n: GRPO compares episodes of one prompt; use 2 or more.")
        if config.trainer.nnodes != 1:
            raise ValueError("trainer.nnodes: the trl backend runs on one machine; use the verl backend to scale out.")
        if config.trainer.test_freq > 0 and self.test_dataset is None:
            raise ValueError(
                f"trainer.test_freq: scoring every {config.trainer.test_freq} steps needs a test dataset; "
                "give test_dataset (or val_dataset), or set trainer.test_freq=-1."
            )

    def train(self) -> TrainResult:
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        config = self.config
        _seed_everything(config.trainer.seed)
        _set_cpu_threads(config)
        from training.models import load_policy

        model, tokenizer, _ = load_policy(config, self.run_path)
        self.attach_default_sinks()
        run = _TRLRun(self, model, tokenizer)
        try:
            return run.train()
        finally:
            self.sinks.close()

    def checkpoint_dir(self) -> Path:
        configured = self.config.trainer.default_local_dir
        return Path(configured) if configured else self.path / "checkpoints"


class _TRLRun:
    """One training run: builds the GRPOConfig and trainer, bridges rollouts, rewards and metrics."""

    def __init__(self, processor: TRLProcessor, model: Any, tokenizer: Any) -> None:
        self.processor = processor
        self.config = processor.config
        self.model = model
        self.tokenizer = tokenizer
        self.spec = processor.agent_spec
        self.tasks = dataset_to_tasks(processor.train_dataset)
        self.outcomes = OutcomeMonitor(self.config.trainer.max_episode_error_rate, self.tasks)
        chat = processor.chat_agent
        required = self.spec.kind == "single_turn" or chat is not None
        self.reward_fn = self.outcomes.watch_reward(processor.reward_fn, required=required)
        if chat is not None:  # its environment scores the answers: with the watched reward while training
            self.spec = chat.to_spec(self.reward_fn, self.config.data.prompt_key).validate()
        self.pending_episode_metrics: list[dict[str, float]] = []
        self.pending_samples: list[dict[str, Any]] = []
        self.last_metrics: dict[str, float] = {}
        self.last_rewards: list[float] = []
        self.step_started = time.perf_counter()
        test = processor.test_dataset
        self.val_tasks = validation_tasks(test, self.config) if test is not None else []
        self.pending_val_metrics: dict[str, float] = {}  # reported with the step's training metrics

    # -- building the trainer ----------------------------------------------------------------
    def grpo_args(self):
        import torch
        from trl import GRPOConfig

        cfg = self.config
        actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
        mini = actor.ppo_mini_batch_size or cfg.data.train_batch_size
        use_cpu = cfg.trainer.device == "cpu" or not torch.cuda.is_available()
        scheduler = actor.optim.lr_scheduler_type
        if scheduler == "constant" and actor.optim.lr_warmup_steps:
            scheduler = "constant_with_warmup"
        save_freq = cfg.trainer.save_freq
        return GRPOConfig(
            output_dir=str(self.processor.checkpoint_dir()),
            max_steps=cfg.trainer.total_training_steps,
            num_train_epochs=cfg.trainer.total_epochs,
            per_device_train_batch_size=mini * rollout.n,
            steps_per_generation=cfg.data.train_batch_size // mini,
            gradient_accumulation_steps=1,
            num_generations=rollout.n,
            max_completion_length=cfg.data.max_response_length,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            learning_rate=actor.optim.lr,
            weight_decay=actor.optim.weight_decay,
            warmup_steps=actor.optim.lr_warmup_steps,
            lr_scheduler_type=scheduler,
            max_grad_norm=actor.grad_clip,
            beta=actor.kl_loss_coef if actor.use_kl_loss else 0.0,
            epsilon=actor.clip_ratio,
            num_iterations=actor.ppo_epochs,
            entropy_coef=actor.entropy_coeff,
            scale_rewards="group" if cfg.algorithm.norm_adv_by_std_in_grpo else "none",
            logging_steps=cfg.trainer.log_freq,
            save_strategy="no" if save_freq == -1 else "steps",
            save_steps=max(save_freq, 1),
            save_total_limit=cfg.trainer.max_checkpoints or None,
            seed=cfg.trainer.seed,
            shuffle_dataset=cfg.data.shuffle,
            remove_unused_columns=False,
            report_to="none",
            use_cpu=use_cpu,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )

    def build_trainer(self):
        from transformers import PrinterCallback

        trainer_cls = _agent_grpo_trainer_class()
        multi_turn = self.spec.is_multi_turn
        trainer = trainer_cls(
            model=self.model,
            reward_funcs=self.multi_turn_reward if multi_turn else self.single_turn_reward,
            args=self.grpo_args(),
            train_dataset=self.trl_dataset(),
            processing_class=self.tokenizer,
            rollout_func=self.rollout if multi_turn else None,
            callbacks=[_make_sink_callback(self)],
        )
        trainer.agent_run = self
        # TRL prints every log dict when its progress bar is off; our sinks report instead.
        trainer.remove_callback(PrinterCallback)
        return trainer

    def trl_dataset(self):
        """TRL reads the ``prompt`` column. Multi-turn episodes are built by our engine from the
        task, so there the prompt is the task's index and the engine looks the task up."""
        from datasets import Dataset

        key = self.config.data.prompt_key
        if self.spec.is_multi_turn:
            return Dataset.from_dict({"prompt": [str(i) for i in range(len(self.tasks))]})
        dataset = self.processor.train_dataset
        if key != "prompt":
            if "prompt" in dataset.column_names:
                dataset = dataset.remove_columns("prompt")
            dataset = dataset.rename_column(key, "prompt")
        return dataset.add_column(ROW_COLUMN, list(range(len(dataset))))

    # -- training --------------------------------------------------------------------------
    def train(self) -> TrainResult:
        from transformers.trainer_utils import get_last_checkpoint

        self.trainer = self.build_trainer()
        checkpoint_dir = self.processor.checkpoint_dir()
        resume = None
        if self.config.trainer.resume_mode == "auto" and checkpoint_dir.is_dir():
            resume = get_last_checkpoint(str(checkpoint_dir))
            if resume:
                logger.info("resuming from checkpoint %s", resume)
        logger.info(
            "training with trl: %d steps, %d prompts x %d episodes per step, agent kind %s",
            self.config.trainer.total_training_steps, self.config.data.train_batch_size,
            self.config.actor_rollout_ref.rollout.n, self.spec.kind,
        )
        self.step_started = time.perf_counter()
        self.trainer.train(resume_from_checkpoint=resume)
        stopped = self.processor.should_stop()
        steps = self.trainer.state.global_step
        self.outcomes.check_finished(steps, stopped, hint=self._steps_hint())
        final_dir = self.processor.path / "final_model"
        self.trainer.save_model(str(final_dir))
        self.tokenizer.save_pretrained(str(final_dir))
        logger.info("training %s after %d steps; model saved to %s", "stopped" if stopped else "finished", steps, final_dir)
        return TrainResult(
            run_path=self.processor.run_path, steps=steps, metrics=dict(self.last_metrics),
            checkpoint=str(final_dir), stopped=stopped,
        )

    # -- single turn -----------------------------------------------------------------------
    def single_turn_reward(self, prompts: list, completions: list, **columns: Any) -> list[float]:
        """TRL reward function: scores each completion with our reward on its dataset row."""
        key = self.config.data.prompt_key
        skip = {"completion_ids", "trainer_state", "log_extra", "log_metric", ROW_COLUMN}
        state = columns.get("trainer_state")
        self.outcomes.step = state.global_step + 1 if state is not None else None
        rows = columns.get(ROW_COLUMN) or [None] * len(prompts)
        tasks, texts = [], []
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            task = {name: values[i] for name, values in columns.items() if name not in skip and isinstance(values, list)}
            task[key] = prompt
            tasks.append(task)
            texts.append(completion if isinstance(completion, str) else completion[-1]["content"])
        scored: list[RewardOutput] = self.reward_fn.score_batch(tasks, texts, rows=rows)
        rewards = [out.reward for out in scored]
        samples = [
            {"task": task, "response": text, "reward": out.reward, "is_correct": out.is_correct}
            for task, text, out in zip(tasks, texts, scored)
        ]
        self.last_rewards = rewards
        self.pending_episode_metrics.append(
            {"solve_rate": sum(s["is_correct"] for s in samples) / max(len(samples), 1), "turns": 1.0}
        )
        self.pending_samples = [_single_turn_episode(s) for s in samples[:SAMPLE_EPISODES_PER_STEP]]
        return rewards

    # -- multi turn ------------------------------------------------------------------------
    def rollout(self, prompts: list[str], trainer: Any) -> dict[str, list]:
        """TRL ``rollout_func``: one episode per prompt entry (TRL repeats each prompt n times)."""
        from training.generation import HFBatchGenerator
        from training.rollout import RolloutEngine, summarize_episodes

        tasks = [self.tasks[int(p)] for p in prompts]
        model = trainer.accelerator.unwrap_model(trainer.model)
        rollout_cfg = self.config.actor_rollout_ref.rollout
        generator = HFBatchGenerator(
            model, self.tokenizer, temperature=rollout_cfg.temperature, top_p=rollout_cfg.top_p,
            seed=self.config.trainer.seed + trainer.state.global_step,
        )
        step = self.outcomes.step = trainer.state.global_step + 1
        engine = RolloutEngine(self.spec, generator, self.tokenizer, self.config, self.reward_fn)
        episodes = asyncio.run(engine.run_episodes(tasks, n=1))
        self.pending_episode_metrics.append(summarize_episodes(episodes))
        self.pending_samples = [e.to_dict() for e in episodes[:SAMPLE_EPISODES_PER_STEP]]
        try:
            self.outcomes.check_episodes(episodes, step)
        except TooManyEpisodeErrors:  # the failed episodes stay visible next to the error
            self.processor.sinks.log_episodes(step, self.pending_samples)
            raise
        eos = self.tokenizer.eos_token_id
        completion_ids, logprobs, env_mask = [], [], []
        for episode in episodes:
            ids, lps, mask = list(episode.response_ids), list(episode.response_logprobs), list(episode.response_mask)
            if not ids:  # TRL needs at least one token; an empty response is an EOS the model is not trained on
                ids, lps, mask = [eos], [0.0], [0]
            completion_ids.append(ids)
            logprobs.append(lps)
            env_mask.append(mask)
        return {
            "prompt_ids": [list(e.prompt_ids) or [eos] for e in episodes],
            "completion_ids": completion_ids,
            "logprobs": logprobs,
            "env_mask": env_mask,
            "episode_reward": [e.reward for e in episodes],
        }

    def multi_turn_reward(self, prompts: list, completions: list, episode_reward: list[float], **_: Any) -> list[float]:
        """The rollout already scored each episode; hand those rewards to TRL."""
        self.last_rewards = list(episode_reward)
        return list(episode_reward)

    def _steps_hint(self) -> str:
        rows, batch = len(self.tasks), self.config.data.train_batch_size
        return (
            f"The training set has {rows} row(s) for batches of data.train_batch_size={batch}, "
            f"trainer.total_training_steps={self.config.trainer.total_training_steps}."
        )

    # -- validation ------------------------------------------------------------------------
    def validation_due(self, step: int, last_step: int) -> bool:
        """Every ``trainer.test_freq`` steps and after the last one, as verl schedules it."""
        every = self.config.trainer.test_freq
        return bool(self.val_tasks) and every > 0 and (step % every == 0 or step >= last_step)

    def validate(self, step: int) -> dict[str, float]:
        """Score the test dataset with the current policy: ``val/<data_source>/...`` metrics."""
        started = time.perf_counter()
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        # The processor's own spec and reward: validation is not training's to count or to fail.
        processor = self.processor
        result = evaluate(processor.agent_spec, model, self.tokenizer, self.config, processor.reward_fn, self.val_tasks, "val")
        logger.info(
            "validation at step %d (%d tasks, %.1f s): %s", step, len(self.val_tasks), time.perf_counter() - started,
            " ".join(f"{k}={v:.4g}" for k, v in result.metrics.items()),
        )
        return result.metrics

    def log_validation(self, step: int, metrics: dict[str, float]) -> None:
        self.last_metrics.update(metrics)
        self.processor.sinks.log_metrics(step, metrics)

    # -- metrics ---------------------------------------------------------------------------
    def report(self, step: int, logs: dict[str, float]) -> None:
        metrics = {TRL_METRIC_NAMES[k]: float(v) for k, v in logs.items() if k in TRL_METRIC_NAMES}
        metrics.update(self.pending_val_metrics)
        self.pending_val_metrics = {}
        if self.pending_episode_metrics:
            merged: dict[str, list[float]] = {}
            for summary in self.pending_episode_metrics:
                for k, v in summary.items():
                    merged.setdefault(k, []).append(v)
            for k, values in merged.items():
                metrics.setdefault(k, sum(values) / len(values))
            self.pending_episode_metrics.clear()
        now = time.perf_counter()
        metrics["step_time"] = (now - self.step_started) / max(self.config.trainer.log_freq, 1)
        self.step_started = now
        self.last_metrics = metrics
        sinks = self.processor.sinks
        sinks.log_metrics(step, metrics)
        sinks.log_episodes(step, self.pending_samples)
        self.pending_samples = []


def _single_turn_episode(sample: dict[str, Any]) -> dict[str, Any]:
    from training.types import Episode, Step, TerminationReason, Trajectory

    step = Step(observation=sample["task"], model_response=sample["response"], reward=sample["reward"], done=True)
    episode = Episode(
        task=sample["task"],
        trajectories=[Trajectory(steps=[step], reward=sample["reward"])],
        is_correct=bool(sample["is_correct"]),
        termination_reason=TerminationReason.ENV_DONE,
    )
    return episode.to_dict()


def _set_cpu_threads(config: Config) -> None:
    import torch

    on_cpu = config.trainer.device == "cpu" or not torch.cuda.is_available()
    if on_cpu and config.trainer.cpu_threads:
        torch.set_num_threads(config.trainer.cpu_threads)


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


_TRAINER_CLASS = None


def _agent_grpo_trainer_class():
    """GRPOTrainer with our advantage estimators and group filtering (built on first use,
    so that importing this module does not import TRL)."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is not None:
        return _TRAINER_CLASS
    import torch
    from trl import GRPOTrainer

    from training.advantages import compute_advantages, equal_reward_groups

    class AgentGRPOTrainer(GRPOTrainer):
        agent_run: _TRLRun

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            algorithm = self.agent_run.config.algorithm
            if algorithm.adv_estimator == "grpo" and not algorithm.filter_groups.enable:
                return output  # TRL's own GRPO advantages are the same computation
            rewards = torch.tensor(self.agent_run.last_rewards, dtype=torch.float32)
            group = self.num_generations
            if algorithm.adv_estimator != "grpo":
                advantages = compute_advantages(
                    rewards, group, algorithm.adv_estimator, norm_by_std=algorithm.norm_adv_by_std_in_grpo
                )
                output["advantages"] = advantages.to(output["advantages"].device)
            if algorithm.filter_groups.enable:
                dropped = equal_reward_groups(rewards, group).repeat_interleave(group)
                keep = (~dropped).to(output["completion_mask"].device)
                output["completion_mask"] = output["completion_mask"] * keep.unsqueeze(1).to(output["completion_mask"].dtype)
                self._metrics["train"]["dropped_groups"].append(float(dropped.float().mean()))
            return output

    _TRAINER_CLASS = AgentGRPOTrainer
    return _TRAINER_CLASS


def _make_sink_callback(run: _TRLRun):
    from transformers import TrainerCallback

    class SinkCallback(TrainerCallback):
        """Routes TRL's logs to our sinks, scores the test dataset on schedule, and polls the
        cooperative stop flag once per step."""

        def on_train_begin(self, args, state, control, **kwargs):
            if run.val_tasks and run.config.trainer.val_before_train:
                run.log_validation(state.global_step, run.validate(state.global_step))

        def on_step_end(self, args, state, control, **kwargs):
            self._poll(control)
            if run.validation_due(state.global_step, state.max_steps) and not run.processor.should_stop():
                metrics = run.validate(state.global_step)
                if control.should_log:  # TRL logs this step next: one report with both
                    run.pending_val_metrics = metrics
                else:
                    run.log_validation(state.global_step, metrics)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                run.report(state.global_step, logs)
                self._poll(control)  # a stop check may depend on what was just reported

        @staticmethod
        def _poll(control):
            if run.processor.should_stop():
                control.should_training_stop = True

    return SinkCallback()

