"""What the tinker and fireworks backends share: a remote training service that speaks Tinker's
protocol (``forward_backward`` / ``optim_step`` / weights saved for a sampler).

The step is the same on both services, and is written once here (``RemoteTrainingLoop``):

1. our rollout engine runs ``data.train_batch_size`` tasks x ``actor_rollout_ref.rollout.n``
   episodes, sampling through the service (a ``TokenGenerator`` over the SDK's sampler);
2. the episodes are laid out as training sequences as on the trl backend (``training.algorithms.episode_rows``:
   one per conversation, so every trajectory of a solver-judge episode is trained with its own
   reward; rLLM's stepwise, filtering and rejection options; the overlong penalty per sequence),
   and group advantages (``algorithm.adv_estimator``) turn each sequence into one ``Datum``: its
   tokens, the sampling log-probabilities, and the advantage on the model's own tokens (0 on the
   prompt and on environment tokens, which are therefore never trained on);
3. ``forward_backward`` with the importance-sampling or PPO loss (``remote.loss_fn``), then
   ``optim_step`` (one pair per ``actor.ppo_mini_batch_size`` prompts), each with the learning rate
   of the step under ``actor.optim.lr_scheduler_type`` and ``lr_warmup_steps`` (``scheduled_lr``:
   transformers' schedules, advanced once per training step as verl's are);
4. the new weights are published for sampling, so the next step samples on-policy; the test
   dataset is scored through the same sampler (``trainer.test_freq``, ``val_before_train``, with
   ``rollout.val_kwargs``; greedy is temperature 0), metrics ``val/<data_source>/...`` as on trl;
5. every ``trainer.save_freq`` steps (and at the end) the training state is saved on the service
   and its path recorded in ``checkpoint-N/checkpoint.json``, written in the attempt's own folder
   (``<run>/attempts/<n>/checkpoints``, on a platform) and published into the run's
   ``<run>/checkpoints`` (``TrainerProcessor.publish_checkpoint``: by a rename, only while the
   attempt owns the run), from which a re-run resumes (``trainer.resume_mode=auto``).

What differs between the services lives in a ``ServiceSession`` (how the session is opened, how
the sampler follows new weights, what is provisioned and torn down) in ``tinker_backend.py`` and
``fireworks_backend.py``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
import uuid
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from training.backends.base import BuiltinProcessor, TrainResult
from training.config import Config, ConfigInput, parse_overrides
from training.errors import ConfigError, RemoteCallError, Terminated
from training.data import dataset_to_tasks
from training.rollouts.generation import GenerationOutput
from training.log import logger
from training.rollouts.models import lora_keys_set
from training.rollouts.outcomes import OutcomeMonitor
from training.algorithms.recipes import clip_range, refuse_recipe_keys
from training.utils import is_package_available
from training.rollouts.validation import summarize, validation_tasks
from training.algorithms.advantages import check_estimator
from training.algorithms.episode_rows import episode_rows, token_advantages
from training.backends.tinker_protocol.rllm_names import RLLM_REMOTE_ALIASES, RLLM_WARMUP_RATIO, translate
from training.rollouts.episode_runner import EpisodeRunner, summarize_episodes
from training.rollouts.models import TINY_MODEL
from training.tracking.episodes import TRAIN, VALIDATION, episode_record, keep_for_store, token_pieces

SAMPLE_EPISODES_PER_STEP = 4
CHECKPOINT_FILE = "checkpoint.json"



def apply_aliases(config: ConfigInput, aliases: dict[str, str]) -> ConfigInput:
    """Overrides with rLLM's names renamed to ours. Giving both names with different values is an error."""
    if config is None or isinstance(config, Config):
        return config
    flat = parse_overrides(config)
    renamed: dict[str, Any] = {}
    for key, value in flat.items():
        ours = aliases.get(key, key)
        if ours in renamed and renamed[ours] != value:
            raise ConfigError(key, f"is rLLM's name for {ours}, which is also set to {renamed[ours]!r}; give one.")
        renamed[ours] = value
    return renamed


def remote_call(service: str, what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except RemoteCallError:
        raise
    except Exception as exc:
        raise RemoteCallError(f"{service} {what} failed: {type(exc).__name__}: {exc}") from exc


@dataclass
class SampleResult:
    completion_ids: list[int]
    logprobs: list[float]
    stopped: bool  # ended on a stop token (else: ran out of max_tokens)


class RemoteGenerator:
    """Our rollout engine's ``TokenGenerator`` over a service's sampler. ``sample`` is the
    service-specific coroutine; every request is one episode's next turn."""

    def __init__(self, sample: Callable[[list[int], int], Any], tokenizer: Any, service: str) -> None:
        self._sample = sample
        self.tokenizer = tokenizer
        self.service = service

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
        result: SampleResult = await self._sample(list(prompt_ids), int(max_new_tokens))
        if len(result.logprobs) != len(result.completion_ids):
            raise RemoteCallError(
                f"{self.service} sampling returned {len(result.completion_ids)} tokens but "
                f"{len(result.logprobs)} log-probabilities; training needs one per token."
            )
        return GenerationOutput(
            text=self.tokenizer.decode(result.completion_ids, skip_special_tokens=True),
            prompt_ids=list(prompt_ids),
            completion_ids=list(result.completion_ids),
            logprobs=[float(x) for x in result.logprobs],
            finish_reason="stop" if result.stopped else "length",
        )


class ServiceSession(ABC):
    """One run's connection to a training service. ``close`` releases every remote resource the
    session created; it is called on success, failure and cancel alike."""

    service: str = "remote"

    def __init__(self) -> None:
        self.remote_ids: dict[str, str] = {}  # shown on the run page: job, deployment, model ids
        self.training_client: Any = None
        self.types: Any = None  # the SDK's types module (Datum, ModelInput, TensorData, AdamParams)

    @abstractmethod
    def generator(self, tokenizer: Any, temperature: float | None = None, top_p: float | None = None) -> RemoteGenerator:
        """The token generator sampling the latest published weights (with the rollout's
        temperature and top_p unless given: validation samples with its own)."""

    @abstractmethod
    def publish(self, name: str) -> str:
        """Save the current weights for sampling and point the sampler at them; returns their path."""

    @abstractmethod
    def save_state(self, name: str) -> str:
        """Save weights and optimizer state for resuming; returns the service's path."""

    @abstractmethod
    def close(self, outcome: str = "success") -> None:
        """Release what the session holds (sessions, jobs, deployments). ``outcome`` is success,
        errored or interrupted. Must not raise."""


@dataclass
class CheckpointRecord:
    step: int
    state_path: str
    sampler_path: str
    service: str
    remote_ids: dict[str, str] = field(default_factory=dict)

    def write(self, target: Path) -> Path:
        """The record as ``target/checkpoint.json``, never half-written (a process may die here)."""
        target.mkdir(parents=True, exist_ok=True)
        written = target / f".{CHECKPOINT_FILE}.{os.getpid()}"
        written.write_text(json.dumps(self.__dict__, indent=1))
        os.replace(written, target / CHECKPOINT_FILE)
        return target

    @staticmethod
    def latest(directory: Path) -> "CheckpointRecord | None":
        """The newest readable record in ``directory``: ``checkpoint-N``, or ``step-N`` as runs
        recorded them before (a run re-queued across an upgrade resumes from those)."""
        records = []
        for path in [*directory.glob(f"checkpoint-*/{CHECKPOINT_FILE}"), *directory.glob(f"step-*/{CHECKPOINT_FILE}")]:
            try:
                records.append(CheckpointRecord(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError) as exc:
                logger.warning("ignoring unreadable checkpoint record %s: %s", path, exc)
        return max(records, key=lambda r: r.step) if records else None


class RemoteProcessor(BuiltinProcessor):
    """A backend whose policy lives in a remote training service. Subclasses name the SDK and the
    API-key variable and open a ``ServiceSession``."""

    sdk_package: str = ""
    sdk_install: str = ""
    api_key_env: str = ""
    aliases: dict[str, str] = RLLM_REMOTE_ALIASES

    def __init__(self, run_path: str) -> None:
        super().__init__(run_path)
        self.session: ServiceSession | None = None
        self.remote_ids_callback: Callable[[dict[str, str]], None] | None = None

    def default_overrides(self) -> dict[str, Any]:
        return {"actor_rollout_ref.model.lora_rank": 32, "trainer.cpu_threads": 1}

    def check_config(self, config: ConfigInput = None) -> Config:
        if config is not None and not isinstance(config, Config) and parse_overrides(config).get("training.lr_schedule") == "linear":
            raise ConfigError(
                "training.lr_schedule",
                f"linear decay is not available on the {self.name} backend; use constant or cosine "
                "(actor_rollout_ref.actor.optim.lr_scheduler_type).",
            )
        if config is not None and not isinstance(config, Config):
            config = translate(parse_overrides(config), self.name)
        config = apply_aliases(config, self.aliases)
        ratio = config.pop(RLLM_WARMUP_RATIO, None) if isinstance(config, dict) else None
        if ratio is None:
            return super().check_config(config)
        ratio = float(ratio)
        if not 0 <= ratio < 1:
            raise ConfigError(RLLM_WARMUP_RATIO, f"must be a share of the steps from 0 up to 1, got {ratio}.")
        steps = super().check_config(config).trainer.total_training_steps
        warmup = int(ratio * steps)
        given = config.get("actor_rollout_ref.actor.optim.lr_warmup_steps")
        if given is not None and int(given) != warmup:
            raise ConfigError(
                RLLM_WARMUP_RATIO,
                f"is {warmup} warm-up steps of {steps}, but actor_rollout_ref.actor.optim.lr_warmup_steps is {given}; give one.",
            )
        logger.info("%s=%s: %d warm-up steps of %d (actor_rollout_ref.actor.optim.lr_warmup_steps)", RLLM_WARMUP_RATIO, ratio, warmup, steps)
        return super().check_config({**config, "actor_rollout_ref.actor.optim.lr_warmup_steps": warmup})

    def check_backend(self, config: Config) -> None:
        problems = self.environment_problems()
        if problems:
            raise ValueError(f"backend: the {self.name} backend cannot run here: " + "; ".join(problems))
        if config.actor_rollout_ref.model.lora_rank < 1:
            raise ConfigError("actor_rollout_ref.model.lora_rank", f"the {self.name} service trains LoRA adapters; use a rank of 1 or more (32 is usual).")
        for key in lora_keys_set(config):  # the services take a rank and choose the rest themselves
            raise ConfigError(key, f"the {self.name} service sets the LoRA adapter's other settings itself (it takes "
                                   "only actor_rollout_ref.model.lora_rank, and remote.lora_train_* for the layers); leave it unset.")
        if config.actor_rollout_ref.rollout.n < 2:
            raise ConfigError("actor_rollout_ref.rollout.n", "group advantages compare episodes of one prompt; use 2 or more.")
        if config.trainer.nnodes != 1:
            raise ConfigError("trainer.nnodes", f"the {self.name} service places the job itself; leave trainer.nnodes at 1.")
        rollout = config.actor_rollout_ref.rollout
        for key, top_k in (("actor_rollout_ref.rollout.top_k", rollout.top_k), ("actor_rollout_ref.rollout.val_kwargs.top_k", rollout.val_kwargs.top_k)):
            if top_k > 0:
                raise ConfigError(key, f"the {self.name} service's sampler is not given a top-k here; leave it at -1 (off) and use top_p.")
        check_estimator(config.algorithm.adv_estimator, self.name)
        if config.trainer.test_freq > 0 and self.test_dataset is None:
            raise ConfigError(
                "trainer.test_freq",
                f"scoring every {config.trainer.test_freq} steps needs a test dataset; give test_dataset (or val_dataset), "
                "or set trainer.test_freq=-1.",
            )
        # the service sums its loss over tokens: one aggregation, one ratio per token
        clip_keys = {"actor_rollout_ref.actor.clip_ratio_low", "actor_rollout_ref.actor.clip_ratio_high"} if config.remote.loss_fn == "ppo" else set()
        refuse_recipe_keys(config, self.name, honoured={"reward_model.overlong_buffer.enable", *clip_keys})

    @classmethod
    def environment_problems(cls) -> list[str]:
        """What stops this backend here: its SDK not installed, its API key not set (names each)."""
        return [problem for problem in cls.environment_status().values() if problem]

    @classmethod
    def environment_status(cls, config: Any = None) -> dict[str, str | None]:
        return {
            "environment": None if is_package_available(cls.sdk_package) else f"its SDK is not installed (pip install '{cls.sdk_install}')",
            "credentials": None if os.environ.get(cls.api_key_env) else f"{cls.api_key_env} is not set (the {cls.name} API key, read from the environment)",
        }

    @classmethod
    def release_abandoned(cls, remote_ids: dict[str, str], run_path: str | Path | None,
                          base_url: str | None = None) -> tuple[list[str], list[str]]:
        """Release what a run whose training process is gone for good (lost with its machine; no
        ``close`` ran) still holds on the service. Returns (released, left), each a resource named
        for people. Nothing by default: a service that provisions per run (fireworks) overrides it."""
        return [], []

    @abstractmethod
    def open_session(self, resume: CheckpointRecord | None) -> ServiceSession:
        """Connect (and provision), starting from ``resume``'s state when given."""

    def load_tokenizer(self) -> Any:
        """The tokenizer of the service's base model, loaded here: episodes are tokenized locally."""
        model = self.config.actor_rollout_ref.model
        if (model.tokenizer_path or model.path) == TINY_MODEL:
            from training.rollouts.tiny import build_char_tokenizer  # brings in torch: imported on first use

            return build_char_tokenizer()
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(model.tokenizer_path or model.path, trust_remote_code=model.trust_remote_code)
        except OSError as exc:
            raise ValueError(
                f"actor_rollout_ref.model.tokenizer_path: could not load the tokenizer of {model.tokenizer_path or model.path!r} "
                f"({exc}); episodes are tokenized locally, so set it to a hub id or directory with the base model's tokenizer."
            ) from exc

    def train(self) -> TrainResult:
        self.attach_default_sinks()
        with self.sinks, _terminate_as_exception():
            return RemoteTrainingLoop(self).run()


@contextmanager
def _terminate_as_exception():
    """While training, SIGTERM raises ``Terminated`` instead of ending the process at once, so
    the session's ``close`` runs (paid jobs and deployments are deleted) before the process exits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated(f"signal {signum}: the training process is being stopped")

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class RemoteTrainingLoop:
    def __init__(self, processor: RemoteProcessor) -> None:
        self.processor = processor
        self.config = processor.config
        self.spec = processor.agent_spec
        self.tasks = dataset_to_tasks(processor.train_dataset)
        self.service = processor.name
        self.last_metrics: dict[str, float] = {}
        self._orders: dict[int, list[int]] = {}
        self.batch_rows: list[int] = []  # the dataset rows of the step's tasks (the episode store's row_index)
        # The checks every backend makes: error rate per step, a reward that raises, zero steps.
        self.outcomes = OutcomeMonitor(self.config.trainer.max_episode_error_rate, self.tasks)
        self.reward_fn = self.outcomes.watch_reward(processor.reward_fn, required=self.spec.kind == "single_turn")
        self.lr_factor = lr_schedule(self.config)
        test = processor.test_dataset
        self.val_tasks = validation_tasks(test, self.config) if test is not None else []

    def run(self) -> TrainResult:
        processor, cfg = self.processor, self.config
        random.seed(cfg.trainer.seed)
        if cfg.trainer.cpu_threads:
            import torch

            torch.set_num_threads(cfg.trainer.cpu_threads)
        tokenizer = processor.load_tokenizer()
        # The run's published records: an earlier attempt's newest (never a superseded one's).
        resume = CheckpointRecord.latest(processor.checkpoint_dir()) if cfg.trainer.resume_mode == "auto" else None
        if resume is not None:
            logger.info("resuming from step %d: %s", resume.step, resume.state_path)
        start = resume.step if resume else 0
        total = cfg.trainer.total_training_steps
        stopped, step, sampler_path = False, start, resume.sampler_path if resume else ""
        session = processor.open_session(resume)
        processor.session = session
        outcome = "errored"
        try:
            if processor.remote_ids_callback is not None:
                processor.remote_ids_callback(dict(session.remote_ids))
            if start >= total:
                logger.info("nothing to train: the latest checkpoint is at step %d of %d", start, total)
            else:
                sampler_path = remote_call(self.service, "publishing the starting weights", lambda: session.publish(f"step-{start:06d}"))
            logger.info(
                "training with %s: %d steps, %d prompts x %d episodes per step, agent kind %s",
                self.service, total, cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n, self.spec.kind,
            )
            if self.val_tasks and cfg.trainer.val_before_train and start == 0 and start < total:
                metrics = self.validate(0, session, tokenizer)  # not again when resuming
                self.last_metrics.update(metrics)
                processor.sinks.log_metrics(0, metrics)
            saved = start
            for step in range(start + 1, total + 1):
                if processor.should_stop():
                    stopped, step = True, step - 1
                    break
                sampler_path = self.train_step(step, session, tokenizer)
                if self._save_due(step, total):
                    self.save(step, session, sampler_path)
                    saved = step
                if processor.should_stop():
                    stopped = step < total
                    break
            if stopped and step > saved:  # a cancelled run keeps what it trained: a re-run resumes here
                self.save(step, session, sampler_path)
            processor.publish_checkpoint(None)  # any a database outage held back
            self.outcomes.check_finished(step, stopped)
            outcome = "interrupted" if stopped else "success"
        except (KeyboardInterrupt, Terminated):
            outcome = "interrupted"
            raise
        finally:
            session.close(outcome)
        logger.info("training %s after %d steps; weights at %s", "stopped" if stopped else "finished", step, sampler_path)
        return TrainResult(
            run_path=processor.run_path, steps=step, metrics=dict(self.last_metrics),
            checkpoint=sampler_path or None, stopped=stopped,
        )

    # -- one step --------------------------------------------------------------------------
    def train_step(self, step: int, session: ServiceSession, tokenizer: Any) -> str:
        cfg = self.config
        started = time.perf_counter()
        n = cfg.actor_rollout_ref.rollout.n
        tasks = self._batch(step)
        self.outcomes.step = step
        engine = EpisodeRunner(self.spec, session.generator(tokenizer), tokenizer, cfg, self.reward_fn)
        episodes = engine.run(tasks, n=n)
        self.outcomes.check_episodes(episodes, step)
        summary = summarize_episodes(episodes)
        sampling_time = time.perf_counter() - started
        # Episodes i*n .. i*n+n-1 are the n episodes of task i.
        batch = episode_rows(episodes, [str(i // n) for i in range(len(episodes))], cfg)
        advantages, dropped = token_advantages(batch, cfg.algorithm, n)
        self.store_episodes(TRAIN, step, episodes, n, tokenizer, self.batch_rows, episode_advantages(batch, advantages, len(episodes)))
        mini = cfg.actor_rollout_ref.actor.ppo_mini_batch_size or cfg.data.train_batch_size
        per_update = mini * n
        loss_sum, tokens, updates, trained_rows = 0.0, 0, 0, 0
        kl_terms: list[float] = []
        for first in range(0, len(episodes), per_update):  # one update per mini-batch of tasks, all their rows
            chunk = [(row, adv) for row, adv in zip(batch.rows, advantages) if first <= row.episode < first + per_update]
            datums, sampled = self._datums(session, chunk)
            if not datums:
                continue
            for _ in range(cfg.actor_rollout_ref.actor.ppo_epochs):
                output = self._update(session, datums, step)
                loss_sum += float(output.metrics.get("loss:sum", 0.0))
                updates += 1
            trained_rows += len(datums)
            tokens += sum(len(lps) for lps in sampled)
            kl_terms.extend(_sampler_trainer_gap(output, sampled))
        if step == cfg.trainer.total_training_steps:  # the run's final model is what this publishes
            self.processor.check_may_write(f"the final weights (step {step})")
        sampler_path = remote_call(self.service, f"publishing the weights of step {step}", lambda: session.publish(f"step-{step:06d}"))
        metrics = {
            **summary,
            **batch.metrics,
            "loss": loss_sum / max(tokens, 1),
            "lr": self.lr(step),
            "optimizer_steps": float(updates),
            "trained_sequences": float(trained_rows),
            "dropped_groups": dropped,
            "sampling_time": sampling_time,
            "step_time": time.perf_counter() - started,
        }
        if kl_terms:
            metrics["kl"] = sum(kl_terms) / len(kl_terms)  # E[log p_sampler - log p_trainer] on the trained tokens
        logged = step % cfg.trainer.log_freq == 0 or step == cfg.trainer.total_training_steps
        if self.validation_due(step) and not self.processor.should_stop():
            scores = self.validate(step, session, tokenizer)
            metrics.update(scores)
            if not logged:
                self.processor.sinks.log_metrics(step, scores)
        self.last_metrics = metrics
        if logged:
            self.processor.sinks.log_metrics(step, metrics)
            self.processor.sinks.log_episodes(step, [e.to_dict() for e in episodes[:SAMPLE_EPISODES_PER_STEP]])
        return sampler_path

    # -- validation ------------------------------------------------------------------------
    def validation_due(self, step: int) -> bool:
        """Every ``trainer.test_freq`` steps and after the last one, as verl schedules it (never when it is -1 or 0)."""
        every = self.config.trainer.test_freq
        return bool(self.val_tasks) and every > 0 and (step % every == 0 or step >= self.config.trainer.total_training_steps)

    def validate(self, step: int, session: ServiceSession, tokenizer: Any) -> dict[str, float]:
        """Score the test dataset on the published weights: ``val/<data_source>/...`` metrics. The
        processor's own reward: validation is not training's to count or to fail."""
        started = time.perf_counter()
        val = self.config.actor_rollout_ref.rollout.val_kwargs
        generator = session.generator(
            tokenizer, temperature=val.temperature if val.do_sample else 0.0, top_p=val.top_p if val.do_sample else 1.0
        )
        engine = EpisodeRunner(self.spec, generator, tokenizer, self.config, self.processor.reward_fn)
        episodes = engine.run(self.val_tasks, n=val.n)
        self.store_episodes(VALIDATION, step, episodes, val.n, tokenizer, list(range(len(self.val_tasks))))
        result = summarize(self.val_tasks, episodes, val.n, "val")
        logger.info(
            "validation at step %d (%d tasks, %.1f s): %s", step, len(self.val_tasks), time.perf_counter() - started,
            " ".join(f"{k}={v:.4g}" for k, v in result.metrics.items()),
        )
        return result.metrics

    # -- the episode store ------------------------------------------------------------------
    def store_episodes(self, split: str, step: int, episodes: list[Any], n: int, tokenizer: Any, rows: list[int],
                       advantages: list[float | None] | None = None) -> None:
        """Records of ``episodes`` (task i's ``n`` episodes consecutive, one group each), the share the
        config keeps, to the sinks that keep every episode (``training.tracking.episodes``): the
        service only samples and trains; the episodes, their tokens and advantages are made here."""
        trainer = self.config.trainer
        if not (trainer.log_episodes and self.processor.sinks.stores_episodes) or not episodes:
            return
        groups = [uuid.uuid4().hex for _ in range(-(-len(episodes) // max(n, 1)))]
        records = [
            episode_record(episode, split=split, step=step, position=i, group=groups[i // n], group_position=i % n,
                           row_index=rows[i // n] if i // n < len(rows) else None,
                           advantage=advantages[i] if advantages else None)
            for i, episode in enumerate(episodes)
        ]
        kept = keep_for_store(records, trainer.log_episodes_fraction, trainer.log_episodes_per_step,
                              trainer.seed + step * 2 + (split == VALIDATION))
        for record in kept:  # decoded here, where the tokenizer is, and only for the records kept
            record["token_texts"] = token_pieces(tokenizer, record["token_ids"])
        self.processor.sinks.store_episodes(step, kept)

    def _batch(self, step: int) -> list[dict]:
        """The tasks of ``step``: the dataset in one (seeded) shuffled order per epoch, so a resumed
        run continues with the same tasks it would have seen."""
        size, count = self.config.data.train_batch_size, len(self.tasks)
        batch = []
        self.batch_rows = []
        for index in range((step - 1) * size, step * size):
            epoch, position = divmod(index, count)
            if epoch not in self._orders:
                order = list(range(count))
                if self.config.data.shuffle:
                    random.Random(self.config.trainer.seed + epoch).shuffle(order)
                self._orders = {epoch: order}  # one epoch's order at a time
            batch.append(self.tasks[self._orders[epoch][position]])
            self.batch_rows.append(self._orders[epoch][position])
        return batch

    def _datums(self, session: ServiceSession, chunk: list[tuple[Any, list[float]]]) -> tuple[list[Any], list[list[float]]]:
        """One Datum per training sequence (``training.algorithms.episode_rows.Row``): inputs are the tokens but
        the last, targets the tokens but the first; the advantage and the sampling log-probability
        sit on the model's own tokens only. Sequences without tokens or not trained on are left out."""
        types = session.types
        datums, sampled = [], []
        for row, advantages in chunk:
            if not row.response_ids or not any(row.loss_mask):
                continue  # no tokens (the first prompt was too long), or masked by a filter
            tokens = list(row.prompt_ids) + list(row.response_ids)
            prompt = len(row.prompt_ids)
            mask = [0] * prompt + list(row.loss_mask)
            logprobs = [0.0] * prompt + list(row.logprobs)
            targets = tokens[1:]
            weights = ([0.0] * prompt + list(advantages))[1:]  # zero on the prompt and on environment tokens
            old = [lp if m else 0.0 for lp, m in zip(logprobs[1:], mask[1:])]
            datums.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={
                        "target_tokens": types.TensorData(data=targets, dtype="int64", shape=[len(targets)]),
                        "logprobs": types.TensorData(data=old, dtype="float32", shape=[len(old)]),
                        "advantages": types.TensorData(data=weights, dtype="float32", shape=[len(weights)]),
                    },
                )
            )
            sampled.append([lp if m else None for lp, m in zip(logprobs[1:], mask[1:])])
        return datums, sampled

    def _update(self, session: ServiceSession, datums: list[Any], step: int) -> Any:
        cfg = self.config
        actor, remote = cfg.actor_rollout_ref.actor, cfg.remote
        loss_config = None
        if remote.loss_fn == "ppo":
            low, high = clip_range(cfg)
            loss_config = {"clip_low_threshold": 1.0 - low, "clip_high_threshold": 1.0 + high}
        adam = session.types.AdamParams(
            learning_rate=self.lr(step), beta1=remote.adam_beta1, beta2=remote.adam_beta2, eps=remote.adam_eps,
            weight_decay=actor.optim.weight_decay, grad_clip_norm=actor.grad_clip,
        )
        client = session.training_client

        def run() -> Any:
            backward = client.forward_backward(datums, remote.loss_fn, loss_config)
            optim = client.optim_step(adam)  # queued behind forward_backward, as the SDK recommends
            output = backward.result()
            optim.result()
            return output

        return remote_call(self.service, f"forward_backward/optim_step at step {step}", run)

    def lr(self, step: int) -> float:
        """The learning rate of training step ``step`` (from 1): the schedule advances once per step."""
        return self.config.actor_rollout_ref.actor.optim.lr * self.lr_factor(step - 1)

    # -- checkpoints -----------------------------------------------------------------------
    def _save_due(self, step: int, total: int) -> bool:
        freq = self.config.trainer.save_freq
        return step == total or (freq > 0 and step % freq == 0)

    def save(self, step: int, session: ServiceSession, sampler_path: str) -> None:
        """Save the training state on the service, record it in this attempt's own folder and publish
        the record into the run's (``TrainerProcessor.publish_checkpoint``: only while the attempt
        owns the run; the run's ``trainer.max_checkpoints`` rotation is done there too). A record a
        database outage held back is published with the next one; a superseded attempt's stays in
        its own folder, never read by a resume."""
        processor = self.processor
        written = processor.attempt_checkpoint_dir() / f"checkpoint-{step}"

        def save_and_record() -> None:  # after ``may_write`` (write_files): the state is paid for
            state_path = remote_call(self.service, f"save_state at step {step}", lambda: session.save_state(f"state-{step:06d}"))
            CheckpointRecord(step=step, state_path=state_path, sampler_path=sampler_path, service=self.service,
                             remote_ids=dict(session.remote_ids)).write(written)
            logger.info("checkpoint of step %d: %s", step, state_path)

        processor.write_files(f"the checkpoint of step {step}", written, save_and_record)
        processor.publish_checkpoint(written)
        if processor.attempt is not None:  # the attempt's own folder keeps its newest, and those not published yet
            keep = {written, *processor.held_back()}
            for older in processor.attempt_checkpoint_dir().glob("checkpoint-*"):
                if older not in keep:
                    shutil.rmtree(older, ignore_errors=True)


def episode_advantages(batch: Any, advantages: list[list[float]], count: int) -> list[float | None]:
    """Each episode's advantage: the mean over the tokens it was trained on (mask 1) of its rows'
    token advantages (None for an episode no token of which was trained)."""
    sums: dict[int, list[float]] = {}
    for row, values in zip(batch.rows, advantages):
        trained = [value for value, m in zip(values, row.loss_mask) if m]
        if row.episode >= 0 and trained:
            sums.setdefault(row.episode, []).extend(trained)
    return [sum(sums[i]) / len(sums[i]) if i in sums else None for i in range(count)]


def lr_schedule(config: Config) -> Callable[[int], float]:
    """The factor on ``actor.optim.lr`` after ``n`` scheduler steps: transformers' constant,
    constant-with-warmup or cosine-with-warmup schedule over ``trainer.total_training_steps``
    (as the trl backend and verl schedule it)."""
    import torch
    from transformers import get_scheduler

    optim = config.actor_rollout_ref.actor.optim
    name = optim.lr_scheduler_type
    if name == "constant" and optim.lr_warmup_steps:
        name = "constant_with_warmup"
    # The schedule's factor only: a throwaway optimizer hosts it, the service holds the real one.
    holder = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=optim.lr)
    scheduler = get_scheduler(
        name, holder, num_warmup_steps=optim.lr_warmup_steps, num_training_steps=config.trainer.total_training_steps
    )
    return scheduler.lr_lambdas[0]


def _sampler_trainer_gap(output: Any, sampled: list[list[float | None]]) -> list[float]:
    """Per-token log p_sampler - log p_trainer on the trained tokens (how off-policy the step was)."""
    gaps = []
    for record, old in zip(getattr(output, "loss_fn_outputs", None) or [], sampled):
        new = record.get("logprobs") if isinstance(record, dict) else None
        if new is None:
            continue
        values = new.tolist() if hasattr(new, "tolist") else list(new.data)
        gaps.extend(o - v for o, v in zip(old, values) if o is not None)
    return gaps
