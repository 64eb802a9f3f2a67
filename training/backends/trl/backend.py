"""The ``trl`` backend: TRL's GRPOTrainer on a CPU or one GPU.

Single-turn tasks use TRL's own generation. Multi-turn agents, workflows and black-box
functions run in our rollout engine, handed to TRL through ``rollout_func``: it returns the
token ids of each episode with ``env_mask`` (0 for environment tokens), so TRL trains only on
what the model produced.

Step semantics: one training step is one optimizer step of TRL (``trainer.total_training_steps``
maps to ``max_steps``); with the defaults each step generates ``data.train_batch_size`` prompts x
``actor_rollout_ref.rollout.n`` episodes.

A run whose model path is a trainer checkpoint folder (a platform fork's is its parent's
``checkpoint-<n>``) starts with that checkpoint's optimizer state where it fits, with its own learning
rate and schedule (``training.backends.trl.optimizer_state``); the sinks are told what was carried
(``log_optimizer_state``).
"""

from __future__ import annotations

import math
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

from training.backends.base import BuiltinProcessor, TrainResult
from training.backends.trl.names import TRL_IMPORTANCE_SAMPLING, TRL_LOSS_TYPES
from training.backends.trl.optimizer_state import OPTIMIZER_FILE, TRAINER_STATE_FILE, carry_optimizer_state
from training.config import Config
from training.data import dataset_to_tasks
from training.log import logger
from training.rollouts.models import lora_config
from training.rollouts.outcomes import OutcomeMonitor, reward_component_means
from training.errors import ConfigError, TooManyEpisodeErrors
from training.types import Episode, RewardOutput, Step, TerminationReason, Trajectory
from training.rollouts.validation import evaluate, validation_tasks
from training.tracking.episodes import TRAIN, VALIDATION, episode_record, keep_for_store, token_pieces
from training.algorithms.recipes import clip_range, overlong_punishment
from training.rollouts.models import load_policy
from training.utils import is_trl_available

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
        return {"environment": None if is_trl_available() else "TRL is not installed", "credentials": None}

    def check_backend(self, config: Config) -> None:
        import torch

        if config.trainer.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("trainer.device: 'cuda' was asked for but this machine has no CUDA GPU; use auto or cpu.")
        if config.actor_rollout_ref.rollout.n < 2:
            raise ValueError("actor_rollout_ref.rollout.n: GRPO compares episodes of one prompt; use 2 or more.")
        if config.trainer.nnodes != 1:
            raise ValueError("trainer.nnodes: the trl backend runs on one machine; use the verl backend to scale out.")
        _check_loss_options(config)
        if config.actor_rollout_ref.rollout.server_url and not _is_vllm_available():
            raise ValueError(
                "actor_rollout_ref.rollout.server_url: generating on a vLLM server needs the vllm package here: TRL "
                "pushes the weights to the server through it (pip install vllm on the GPU machine), or leave it unset."
            )
        if self.agent_spec.kind == "single_turn":
            from training.algorithms.episode_rows import refuse_row_options  # brings in torch: imported on first use

            refuse_row_options(config, "a plain single-turn prompt is generated and trained by TRL itself; give an agent or a workflow")
        if config.rllm.rejection_sample.multiplier != 1:
            raise ConfigError(
                "rllm.rejection_sample.multiplier",
                "sampling extra tasks to refill rejected ones is not available on the trl backend, whose batches "
                "are TRL's; set it to 1 (rejected tasks are then masked, not replaced).",
            )
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

        model, tokenizer, _ = load_policy(config, self.run_path)
        self.attach_default_sinks()
        run = _TRLRun(self, model, tokenizer)
        with self.sinks:
            return run.train()


def last_complete_checkpoint(folder: Path) -> str | None:
    """The newest ``checkpoint-<step>`` in ``folder`` that was saved to the end. transformers writes
    ``trainer_state.json`` last (and only then deletes older checkpoints), so a process killed while
    saving leaves a folder without it; resuming from that one would fail."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    steps = []
    for path in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        suffix = path.name[len(PREFIX_CHECKPOINT_DIR) + 1:]
        if suffix.isdigit() and (path / "trainer_state.json").is_file():
            steps.append((int(suffix), path))
    return str(max(steps)[1]) if steps else None


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
        self.step_started = time.perf_counter()
        test = processor.test_dataset
        self.val_tasks = validation_tasks(test, self.config) if test is not None else []
        self.pending_val_metrics: dict[str, float] = {}  # reported with the step's training metrics
        self.rows = None  # the current generation batch as training rows (multi-turn)
        # The current generation batch, for the episode store: our rollout's episodes (multi-turn) or
        # TRL's completions with their scores (single-turn), and each one's dataset row.
        self.batch_episodes: list[Episode] = []
        self.batch_rows: list[int | None] = []
        self.endpoint = None  # the OpenAI-compatible endpoint of an rLLM-style agent_run_func, while training

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
            output_dir=str(self.processor.attempt_checkpoint_dir()),  # published from there (on_save)
            max_steps=cfg.trainer.total_training_steps,
            num_train_epochs=cfg.trainer.total_epochs,
            per_device_train_batch_size=mini * rollout.n,
            steps_per_generation=cfg.data.train_batch_size // mini,
            gradient_accumulation_steps=1,
            num_generations=rollout.n,
            max_completion_length=cfg.data.max_response_length,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=max(rollout.top_k, 0),  # TRL's "off" is 0
            learning_rate=actor.optim.lr,
            weight_decay=actor.optim.weight_decay,
            warmup_steps=actor.optim.lr_warmup_steps,
            lr_scheduler_type=scheduler,
            max_grad_norm=actor.grad_clip,
            beta=actor.kl_loss_coef if actor.use_kl_loss else 0.0,
            num_iterations=actor.ppo_epochs,
            entropy_coef=actor.entropy_coeff,
            gradient_checkpointing=cfg.actor_rollout_ref.model.enable_gradient_checkpointing,
            **trl_loss_options(cfg),
            **_vllm_server_options(cfg),
            logging_steps=cfg.trainer.log_freq,
            save_strategy="no" if save_freq == -1 else "steps",
            save_steps=max(save_freq, 1),
            # An attempt's own folder needs its newest only (hard links of what it published); the run's
            # published checkpoints keep trainer.max_checkpoints (TrainerProcessor.publish_checkpoint), and
            # the best by trainer.metric_for_best_model, which TRL's own rotation would remove.
            save_total_limit=1 if self.processor.attempt is not None
            else None if cfg.trainer.metric_for_best_model else cfg.trainer.max_checkpoints or None,
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

        reward = self.multi_turn_reward if multi_turn else self.single_turn_reward
        punishment = overlong_punishment(self.config)  # weighted by grpo_args' reward_weights
        trainer = trainer_cls(
            model=self.model,
            reward_funcs=[reward] if punishment is None else [reward, punishment],
            args=self.grpo_args(),
            train_dataset=self.trl_dataset(),
            processing_class=self.tokenizer,
            rollout_func=self.rollout if multi_turn else None,
            callbacks=[_make_sink_callback(self)],
            # lora_rank > 0: TRL wraps the model in a peft adapter; only the adapter trains, checkpoints and
            # the final model hold it, and our rollouts generate through it (trainer.model is the PeftModel).
            peft_config=lora_config(self.config),
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
        self.trainer = self.build_trainer()
        # The run's published checkpoints: an earlier attempt's newest (never a superseded one's).
        checkpoint_dir = self.processor.checkpoint_dir()
        resume = None
        if self.config.trainer.resume_mode == "auto" and checkpoint_dir.is_dir():
            resume = last_complete_checkpoint(checkpoint_dir)
            if resume:
                logger.info("resuming from checkpoint %s", resume)
        logger.info(
            "training with trl: %d steps, %d prompts x %d episodes per step, agent kind %s",
            self.config.trainer.total_training_steps, self.config.data.train_batch_size,
            self.config.actor_rollout_ref.rollout.n, self.spec.kind,
        )
        self.step_started = time.perf_counter()
        from training.rollouts.chat_endpoint import chat_endpoint_for  # brings in starlette: imported on first use

        with chat_endpoint_for(self.spec, self.tokenizer, self.config.actor_rollout_ref.model.path) as self.endpoint:
            self.trainer.train(resume_from_checkpoint=resume)
        stopped = self.processor.should_stop()
        steps = self.trainer.state.global_step
        self.outcomes.check_finished(steps, stopped, hint=self._steps_hint())
        self.processor.publish_checkpoint(None)  # any a database outage held back
        if stopped:  # only a run that finished publishes a model; a stopped one keeps its last checkpoint
            checkpoint = last_complete_checkpoint(checkpoint_dir) if checkpoint_dir.is_dir() else None
            logger.info("training stopped after %d steps; last checkpoint %s", steps, checkpoint)
            return TrainResult(run_path=self.processor.run_path, steps=steps, metrics=dict(self.last_metrics),
                               checkpoint=checkpoint, stopped=True)
        written = self.processor.attempt_dir() / "final_model"
        final_dir = self.processor.path / "final_model"

        def save_final_model() -> None:
            self.trainer.save_model(str(written))
            self.tokenizer.save_pretrained(str(written))

        self.processor.write_files("the final model", written, save_final_model)
        self.processor.publish("the final model", written, final_dir, wait=True)
        logger.info("training finished after %d steps; model saved to %s", steps, final_dir)
        return TrainResult(
            run_path=self.processor.run_path, steps=steps, metrics=dict(self.last_metrics),
            checkpoint=str(final_dir), stopped=False,
        )

    def start_optimizer(self, optimizer: Any) -> None:
        """At a run's fresh start from a model folder (a fork's is its parent's ``checkpoint-<n>``): carry
        the optimizer state saved beside those weights into the fresh ``optimizer`` where it fits
        (``carry_optimizer_state``), and tell the sinks what was carried or why not
        (``log_optimizer_state``: ``{"carried": bool, "why": str}``). Not on a resume: that loads its own
        checkpoint's optimizer and schedule."""
        folder = Path(self.config.actor_rollout_ref.model.path)
        if not folder.is_dir():  # a hub id: weights only
            return
        why = carry_optimizer_state(optimizer, folder)
        if why is None:
            logger.info("optimizer state carried from %s (the learning rate and its schedule are this run's own, "
                        "counted from step 1)", folder)
        elif any((folder / name).is_file() for name in (OPTIMIZER_FILE, TRAINER_STATE_FILE)):
            logger.warning("optimizer state not carried from %s: %s; training with a fresh optimizer", folder, why)
        self.processor.sinks.log_optimizer_state({"carried": why is None, "why": why or ""})

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
            {"task": task, "prompt": prompt, "response": text, "completion_ids": ids, "reward": out.reward,
             "is_correct": out.is_correct, "reward_components": dict(out.metadata or {})}
            for task, prompt, text, ids, out in zip(tasks, prompts, texts, columns["completion_ids"], scored)
        ]
        if self.keeps_episodes:
            self.batch_episodes = [Episode.from_dict(_single_turn_episode(s)) for s in samples]
            for episode, sample in zip(self.batch_episodes, samples):
                episode.info["reward_components"] = sample["reward_components"]
            self.batch_rows = list(rows)
        self.pending_episode_metrics.append(
            {"solve_rate": sum(s["is_correct"] for s in samples) / max(len(samples), 1), "turns": 1.0,
             **reward_component_means([s["reward_components"] for s in samples])}
        )
        self.pending_samples = [_single_turn_episode(s) for s in samples[:SAMPLE_EPISODES_PER_STEP]]
        return rewards

    # -- multi turn ------------------------------------------------------------------------
    def start_rollout(self, inputs: list[dict], trainer: Any) -> list[dict]:
        """Run one episode per input (TRL repeats each prompt n times) and lay the episodes out as
        training rows (``training.algorithms.episode_rows``). Returns TRL's inputs: the same ones when each
        episode is one row, else one input per row (then ``finish_rollout`` sets the advantages)."""
        from training.algorithms.episode_rows import episode_rows, equal_reward_groups, pad_rows  # brings in torch: imported on first use
        from training.rollouts.generation import HFBatchGenerator  # brings in torch: imported on first use
        from training.rollouts.episode_runner import EpisodeRunner, summarize_episodes  # brings in torch: imported on first use

        tasks = [self.tasks[int(x["prompt"])] for x in inputs]
        model = trainer.accelerator.unwrap_model(trainer.model)
        rollout_cfg = self.config.actor_rollout_ref.rollout
        seed = self.config.trainer.seed + trainer.state.global_step
        if rollout_cfg.server_url:  # TRL has pushed this step's weights to the server
            from training.rollouts.vllm_server import VLLMServerGenerator  # brings in torch: imported on first use

            generator = VLLMServerGenerator(
                rollout_cfg.server_url, self.tokenizer, temperature=rollout_cfg.temperature, top_p=rollout_cfg.top_p,
                top_k=rollout_cfg.top_k, seed=seed,
            )
        else:
            generator = HFBatchGenerator(
                model, self.tokenizer, temperature=rollout_cfg.temperature, top_p=rollout_cfg.top_p, top_k=rollout_cfg.top_k,
                seed=seed,
            )
        step = self.outcomes.step = trainer.state.global_step + 1
        engine = EpisodeRunner(self.spec, generator, self.tokenizer, self.config, self.reward_fn, self.endpoint)
        episodes = engine.run(tasks, n=1)
        self.batch_episodes, self.batch_rows = episodes, [int(x["prompt"]) for x in inputs]
        summary = summarize_episodes(episodes)
        self.pending_samples = [e.to_dict() for e in episodes[:SAMPLE_EPISODES_PER_STEP]]
        try:
            self.outcomes.check_episodes(episodes, step)
        except TooManyEpisodeErrors:  # the failed episodes stay visible next to the error
            self.processor.sinks.log_episodes(step, self.pending_samples)
            raise
        # TRL's groups: the n consecutive inputs of one prompt.
        self.rows = episode_rows(episodes, [str(i // trainer.num_generations) for i in range(len(inputs))], self.config)
        summary.update(self.rows.metrics)
        self.pending_episode_metrics.append(summary)
        if not self.rows.expanded:
            return inputs
        if self.config.algorithm.filter_groups.enable:
            dropped = equal_reward_groups(self.rows)
            for row in self.rows.rows:
                row.trainable = row.trainable and row.group not in dropped
            summary["dropped_groups"] = len(dropped) / max(len({row.group for row in self.rows.rows}), 1)
        # TRL splits the rows into groups of n and into optimizer steps: pad with masked rows.
        pad_rows(self.rows, math.lcm(trainer.num_generations, trainer.args.steps_per_generation))
        return [{"prompt": str(k)} for k in range(len(self.rows.rows))]

    def rollout(self, prompts: list[str], trainer: Any) -> dict[str, list]:
        """TRL ``rollout_func``: the rows laid out by ``start_rollout``, one per prompt entry."""
        rows = self.rows.rows
        if len(prompts) != len(rows):
            raise RuntimeError(f"TRL asked for {len(prompts)} completions for a batch of {len(rows)} rows.")
        eos = self.tokenizer.eos_token_id
        completion_ids, logprobs, env_mask = [], [], []
        for row in rows:
            ids, lps, mask = list(row.response_ids), list(row.logprobs), list(row.loss_mask)
            if not ids:  # TRL needs at least one token; an empty response is an EOS the model is not trained on
                ids, lps, mask = [eos], [0.0], [0]
            completion_ids.append(ids)
            logprobs.append(lps)
            env_mask.append(mask)
        return {
            "prompt_ids": [list(row.prompt_ids) or [eos] for row in rows],
            "completion_ids": completion_ids,
            "logprobs": logprobs,
            "env_mask": env_mask,
            "episode_reward": [row.reward for row in rows],
        }

    def finish_rollout(self, output: dict[str, Any]) -> dict[str, Any]:
        """Advantages of expanded rows: each unit compared within its group (``episode_rows``)."""
        from training.algorithms.episode_rows import row_advantages  # brings in torch: imported on first use

        completion_mask = output["completion_mask"]
        model_tokens = completion_mask * output["tool_mask"] if "tool_mask" in output else completion_mask
        advantages = row_advantages(self.rows, self.config.algorithm).to(completion_mask.device)
        output["advantages"] = advantages.unsqueeze(1) * model_tokens  # token-level, as verl's estimators give
        return output

    def multi_turn_reward(self, prompts: list, completions: list, episode_reward: list[float | None], **_: Any) -> list:
        """The rollout already scored each row; hand those rewards to TRL (None: a padding row)."""
        return list(episode_reward)

    def _steps_hint(self) -> str:
        rows, batch = len(self.tasks), self.config.data.train_batch_size
        return (
            f"The training set has {rows} row(s) for batches of data.train_batch_size={batch}, "
            f"trainer.total_training_steps={self.config.trainer.total_training_steps}."
        )

    # -- validation ------------------------------------------------------------------------
    def validation_due(self, step: int, last_step: int) -> bool:
        """Every ``trainer.test_freq`` steps and after the last one, as verl schedules it (never when it is -1 or 0)."""
        every = self.config.trainer.test_freq
        return bool(self.val_tasks) and every > 0 and (step % every == 0 or step >= last_step)

    def validate(self, step: int) -> dict[str, float]:
        """Score the test dataset with the current policy: ``val/<data_source>/...`` metrics."""
        started = time.perf_counter()
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        # The processor's own spec and reward: validation is not training's to count or to fail.
        processor = self.processor
        result = evaluate(processor.agent_spec, model, self.tokenizer, self.config, processor.reward_fn, self.val_tasks, "val")
        if self.keeps_episodes:
            n = self.config.actor_rollout_ref.rollout.val_kwargs.n
            self.keep_records(VALIDATION, step, result.episodes, [i // n for i in range(len(result.episodes))], n)
        logger.info(
            "validation at step %d (%d tasks, %.1f s): %s", step, len(self.val_tasks), time.perf_counter() - started,
            " ".join(f"{k}={v:.4g}" for k, v in result.metrics.items()),
        )
        return result.metrics

    def log_validation(self, step: int, metrics: dict[str, float]) -> None:
        self.last_metrics.update(metrics)
        self.processor.sinks.log_metrics(step, metrics)

    # -- the episode store -----------------------------------------------------------------
    @property
    def keeps_episodes(self) -> bool:
        """Whether this run keeps every episode: ``trainer.log_episodes`` and a sink that keeps them."""
        return self.config.trainer.log_episodes and self.processor.sinks.stores_episodes

    def store_episodes(self, output: dict[str, Any]) -> None:
        """Hand the generation batch's episodes, with the advantage each was trained with, to the
        sinks that keep every episode (``training.tracking.episodes``)."""
        if not self.keeps_episodes or not self.batch_episodes:
            return
        episodes, self.batch_episodes = self.batch_episodes, []
        step = self.outcomes.step or self.trainer.state.global_step + 1
        if not self.spec.is_multi_turn:
            _single_turn_tokens(episodes, output)
        self.keep_records(TRAIN, step, episodes, self.batch_rows, self.trainer.num_generations,
                          _episode_advantages(output, len(episodes), self.rows if self.spec.is_multi_turn else None))

    def keep_records(self, split: str, step: int, episodes: list[Episode], rows: list[int | None], group_size: int,
                     advantages: list[float | None] | None = None) -> None:
        """Records of ``episodes`` (groups of ``group_size`` consecutive ones, as TRL repeats each
        prompt), the share the config keeps, to the sinks."""
        trainer_config = self.config.trainer
        groups = [uuid.uuid4().hex for _ in range(-(-len(episodes) // max(group_size, 1)))]
        records = [
            episode_record(episode, split=split, step=step, position=i, group=groups[i // group_size],
                           group_position=i % group_size, row_index=rows[i] if i < len(rows) else None,
                           advantage=advantages[i] if advantages else None)
            for i, episode in enumerate(episodes)
        ]
        seed = trainer_config.seed + step * 2 + (split == VALIDATION)
        kept = keep_for_store(records, trainer_config.log_episodes_fraction, trainer_config.log_episodes_per_step, seed)
        for record in kept:  # decoded here, where the tokenizer is, and only for the records kept
            record["token_texts"] = token_pieces(self.tokenizer, record["token_ids"])
        self.processor.sinks.store_episodes(step, kept)

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
            # TRL's reward is per row; where episodes became several rows, the episodes' own reward is the one to show.
            episode_level = ("reward", "reward_std") if self.rows is not None and self.rows.expanded else ()
            for k, values in merged.items():
                if k in episode_level or k not in metrics:
                    metrics[k] = sum(values) / len(values)
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
    """One of TRL's completions as an episode: the prompt the model read (the dataset row is the
    task, not an observation: no environment answers here) and the completion, every one of whose
    tokens TRL trains (it masks none: ``mask_truncated_completions`` is left off)."""
    prompt, completion_ids = sample["prompt"], list(sample["completion_ids"])
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    step = Step(chat_completions=messages, model_response=sample["response"], reward=sample["reward"], done=True,
                response_ids=completion_ids)
    episode = Episode(
        task=sample["task"],
        trajectories=[Trajectory(steps=[step], reward=sample["reward"])],
        is_correct=bool(sample["is_correct"]),
        termination_reason=TerminationReason.ENV_DONE,
        response_ids=completion_ids,
        response_mask=[1] * len(completion_ids),
    )
    return episode.to_dict()


def _single_turn_tokens(episodes: list[Episode], output: dict[str, Any]) -> None:
    """The prompt's tokens (TRL pads prompts on the left) and the sampling logprobs where TRL
    computed them, onto each episode (its completion's tokens came with the reward call)."""
    prompt_ids, prompt_mask = output["prompt_ids"].tolist(), output["prompt_mask"].tolist()
    logprobs = output.get("sampling_per_token_logps")
    if logprobs is None:
        logprobs = output.get("old_per_token_logps")
    logprobs = logprobs.tolist() if logprobs is not None else None
    for i, episode in enumerate(episodes[:len(prompt_ids)]):
        episode.prompt_ids = [t for t, m in zip(prompt_ids[i], prompt_mask[i]) if m]
        episode.response_logprobs = logprobs[i][:len(episode.response_ids)] if logprobs is not None else []


def _episode_advantages(output: dict[str, Any], count: int, rows: Any) -> list[float | None]:
    """Each episode's advantage: the mean over the tokens it was trained on of TRL's (token-level)
    advantages; with several rows per episode (``rows.expanded``), the mean over its rows."""
    advantages = output["advantages"]
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    completion_mask = output["completion_mask"]
    mask = (completion_mask * output["tool_mask"] if "tool_mask" in output else completion_mask).float()
    mask = mask if mask.shape == advantages.shape else mask.new_ones(advantages.shape)
    trained = mask.sum(dim=1)
    per_row = ((advantages.float() * mask).sum(dim=1) / trained.clamp(min=1)).tolist()
    per_row = [value if tokens > 0 else None for value, tokens in zip(per_row, trained.tolist())]
    if rows is None or not rows.expanded:
        return per_row[:count]
    sums: dict[int, list[float]] = {}
    for row, value in zip(rows.rows, per_row):
        if row.episode >= 0 and value is not None:
            sums.setdefault(row.episode, []).append(value)
    return [sum(sums[i]) / len(sums[i]) if i in sums else None for i in range(count)]


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


def _check_loss_options(config: Config) -> None:
    """Refuse by name what TRL's loss cannot do: verl's other policy losses and the estimators
    that need a critic, a baseline rollout or several reward components."""
    from training.algorithms.advantages import check_estimator  # brings in torch: imported on first use

    check_estimator(config.algorithm.adv_estimator, "trl")
    mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
    if mode not in TRL_IMPORTANCE_SAMPLING:
        raise ConfigError(
            "actor_rollout_ref.actor.policy_loss.loss_mode",
            f"{mode!r} cannot be honoured by the trl backend (it offers {', '.join(TRL_IMPORTANCE_SAMPLING)}); "
            "use the verl backend for verl's other policy losses.",
        )


def trl_loss_options(config: Config) -> dict[str, Any]:
    """GRPOConfig options for verl's loss keys (see training/algorithms/recipes.py)."""
    actor = config.actor_rollout_ref.actor
    low, high = clip_range(config)
    options: dict[str, Any] = {
        "loss_type": TRL_LOSS_TYPES[actor.loss_agg_mode],
        "importance_sampling_level": TRL_IMPORTANCE_SAMPLING[actor.policy_loss.loss_mode],
        "epsilon": low,
        "epsilon_high": high,
        # TRL's own advantages are replaced by verl's (AgentGRPOTrainer); its scaling stays consistent for its logs
        "scale_rewards": "group" if config.algorithm.norm_adv_by_std_in_grpo else "none",
    }
    buffer = config.reward_model.overlong_buffer
    if buffer.enable:
        options["reward_weights"] = [1.0, buffer.penalty_factor]
    return options


def _vllm_server_options(config: Config) -> dict[str, Any]:
    url = config.actor_rollout_ref.rollout.server_url
    if not url:
        return {}
    return {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": url}


def _is_vllm_available() -> bool:
    from trl.import_utils import is_vllm_available

    return is_vllm_available()


_TRAINER_CLASS = None


def _agent_grpo_trainer_class():
    """GRPOTrainer with verl's advantage estimators and group filtering (built on first use,
    so that importing this module does not import TRL)."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is not None:
        return _TRAINER_CLASS
    import torch
    from trl import GRPOTrainer

    from training.algorithms.advantages import compute_advantages, equal_reward_groups  # brings in torch: imported on first use
    from training.backends.trl.length_chunks import score_in_chunks  # brings in torch

    class AgentGRPOTrainer(GRPOTrainer):
        agent_run: _TRLRun

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            weights = self.reward_weights.to(rewards_per_func.device)
            self.episode_rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # as TRL sums them
            return rewards_per_func

        def _save_checkpoint(self, model, trial):
            step = self.state.global_step
            folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{step}"
            save = super()._save_checkpoint
            return self.agent_run.processor.write_files(f"the checkpoint of step {step}", folder, lambda: save(model, trial))

        def _generate_and_score_completions(self, inputs):
            run = self.agent_run
            if run.spec.is_multi_turn:  # our rollout; several rows per episode where it has several trajectories
                inputs = run.start_rollout(inputs, self)
            output = super()._generate_and_score_completions(inputs)
            if run.spec.is_multi_turn and run.rows.expanded:
                output = run.finish_rollout(output)
            else:
                self._own_advantages(output)
            run.store_episodes(output)
            return output

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                               compute_entropy=False, compute_aux_loss=False, **multimodal):
            # Text rows are scored in chunks of similar length without their shared padding
            # (training.backends.trl.length_chunks). Images, and a MoE's load-balancing loss (a mean over
            # TRL's chunks), keep TRL's own chunks.
            whole = super()._get_per_token_logps_and_entropies
            if compute_aux_loss or any(value is not None for value in multimodal.values()):
                return whole(model, input_ids, attention_mask, logits_to_keep, batch_size,
                             compute_entropy, compute_aux_loss, **multimodal)

            def score(ids, mask, keep, rows):
                logps, entropies, _ = whole(model, ids, mask, keep, rows, compute_entropy)
                return logps, entropies

            logps, entropies = score_in_chunks(score, input_ids, attention_mask, logits_to_keep, batch_size or input_ids.size(0))
            return logps, entropies, None

        def _own_advantages(self, output):
            algorithm = self.agent_run.config.algorithm
            completion_mask = output["completion_mask"]
            model_tokens = completion_mask * output["tool_mask"] if "tool_mask" in output else completion_mask
            rewards = self.episode_rewards.detach().float().cpu()
            group = self.num_generations
            advantages = compute_advantages(rewards, model_tokens.cpu(), group, algorithm, sequence_mask=completion_mask.cpu())
            output["advantages"] = advantages.to(completion_mask.device)
            if algorithm.filter_groups.enable:
                dropped = equal_reward_groups(rewards, group).repeat_interleave(group)
                keep = (~dropped).to(completion_mask.device)
                output["completion_mask"] = completion_mask * keep.unsqueeze(1).to(completion_mask.dtype)
                # token-mean over the groups that teach something, as verl's DAPO batch holds only those
                output["num_items_in_batch"] = (model_tokens * keep.unsqueeze(1).to(model_tokens.dtype)).sum()
                self._metrics["train"]["dropped_groups"].append(float(dropped.float().mean()))

    _TRAINER_CLASS = AgentGRPOTrainer
    return _TRAINER_CLASS


def _make_sink_callback(run: _TRLRun):
    from transformers import TrainerCallback

    class SinkCallback(TrainerCallback):
        """Routes TRL's logs to our sinks, scores the test dataset on schedule, and polls the
        cooperative stop flag once per step."""

        def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
            if state.global_step == 0:  # a resume has loaded its own checkpoint's optimizer
                run.start_optimizer(optimizer)
            # Not again when resuming from a checkpoint: the run scored its start before its first step.
            if run.val_tasks and run.config.trainer.val_before_train and state.global_step == 0:
                run.log_validation(state.global_step, run.validate(state.global_step))

        def on_step_end(self, args, state, control, **kwargs):
            self._poll(control)
            if run.validation_due(state.global_step, state.max_steps) and not run.processor.should_stop():
                metrics = run.validate(state.global_step)
                if control.should_log:  # TRL logs this step next: one report with both
                    run.pending_val_metrics = metrics
                else:
                    run.log_validation(state.global_step, metrics)

        def on_save(self, args, state, control, **kwargs):
            # Called once the checkpoint is whole in the attempt's folder: published into the run's
            # (only while this attempt owns the run), then sinks that keep files (an artifact store) take it.
            saved = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if saved.is_dir():
                run.processor.publish_checkpoint(saved)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                run.report(state.global_step, logs)
                self._poll(control)  # a stop check may depend on what was just reported

        @staticmethod
        def _poll(control):
            if run.processor.should_stop():
                control.should_training_stop = True
                # A stopped run keeps a checkpoint of its last step: a later attempt resumes from it.
                control.should_save = True

    return SinkCallback()

