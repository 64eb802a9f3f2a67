"""What verl's rollout dumps leave out, added by our verl job: the tokens verl trained on, and more.

verl 0.9.1 dumps each training step's rollouts (``trainer.rollout_data_dir``, ``<step>.jsonl``) as
text: ``input``, ``output``, ``gts``, ``score`` and ``step``. Its default trainer
(``trainer.use_v1``, ``verl.trainer.ppo.v1``) adds ``uid`` (each sample's TransferQueue key,
``<uid>_<session>_<index>``) and nothing else: not the reward function's other values, so neither
our agent loop's episode record (``reward_extra_info[EPISODE_RECORD_KEY]``, with its per-turn
timings) nor its termination and error; its legacy trainer (``trainer.use_v1=false``) dumps those.
Neither dumps a token id.

The TaskRunner our backend launches (``task_runner``) is verl's own, training with verl's own
trainer class whose dump and validation methods are extended here: before verl writes a step's
rows, each gets the keys ``training.backends.verl.backend.DUMP_COLUMNS`` names, from the batch verl
trained on (and so does each row of its validation dumps, ``trainer.validation_data_dir``, from
the batch verl validated on, see below):

- ``prompt_ids``, ``response_ids``, ``response_mask``: the sample's tokens without padding, the
  mask as verl trained with it (1 on the model's tokens; 0 on a tool's or environment's, and where
  verl's rollout correction rejected tokens);
- ``rollout_log_probs``: the rollout engine's log-probabilities, where verl computed them;
- ``token_texts``: each response token decoded alone, for rows without our agent loop's record
  (which carries its own);
- ``data_source`` and ``row_index`` (the dataset row, ``extra_info.index``);
- ``generation_seconds``: verl's own time generating the sample (``AgentLoopMetrics
  .generate_sequences``). The default trainer keeps it in its TransferQueue; the legacy trainer's
  rollout manager folds its samples' times into the step's timing (``_performance_metrics``) and
  drops them, so there each sample's time is kept on the generated batch first
  (``keep_sample_seconds``);
- from the default trainer, the reward function's other values as the legacy trainer dumps them
  (our agent loop's record among them).

verl's own keys keep their names and values, so the file reads for a verl user as before.

Validation: verl dumps its validation rows only once every validation batch is done, and by then
it has dropped each batch's tokens (the default trainer clears each batch from its TransferQueue
once it has read its text; the legacy trainer keeps only the text and reward values). So our rows
are taken where verl still has each batch, while its validation method runs: from the default
trainer's replay buffer as verl samples each validation batch (``ValidationSampler``: read from
the TransferQueue by key, as a training step's), from the legacy trainer's rollout manager as it
generates each (``ValidationGenerator``: the generated ``DataProto``, verl's padding rows left
out). The validation rows get the same keys as the training rows; ``rollout_log_probs`` where the rollout computed them
(``rollout.calculate_log_probs``); and the reward function's other values are verl's own there
(both trainers dump them in validation).
Where our columns cannot be made (a batch laid out otherwise than verl 0.9.1 lays it out), verl's
dump is written without them and the error is logged: it never stops training or validation.

verl and Ray are imported at the top: this module is imported only where verl trains.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import ray
import torch
import transfer_queue as tq
from verl import DataProto
from verl.trainer import main_ppo_v0
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.v1 import trainer_base

from training.backends.verl.backend import (
    DUMP_DATA_SOURCE, DUMP_GENERATION_SECONDS, DUMP_LOGPROBS, DUMP_PROMPT_IDS, DUMP_RESPONSE_IDS,
    DUMP_RESPONSE_MASK, DUMP_ROW_INDEX, DUMP_TOKEN_TEXTS, EPISODE_RECORD_KEY,
)
from training.log import logger
from training.tracking.episodes import token_pieces

# verl's own keys of a dump row (``_write_generations``): never replaced by ours.
VERL_DUMP_KEYS = ("input", "output", "gts", "score", "step", "uid")
# Fields of verl's TransferQueue every sample of a training batch has (``AgentLoopOutput.as_dict``).
TRANSFER_QUEUE_FIELDS = ("prompts", "responses", "response_mask")
# Fields a batch may lack: log-probabilities where the rollout computed none, the agent loop's
# metrics and extra fields (another agent loop manager's), the dataset's columns.
OPTIONAL_TRANSFER_QUEUE_FIELDS = ("rollout_log_probs", "metrics", "extra_fields", "data_source", "extra_info")


def sample_columns(prompts: list[list[int]], responses: list[list[int]], masks: list[list[int]],
                   logprobs: list[list[float]] | None, tokenizer: Any, *, data_sources: Iterable[Any] | None = None,
                   extra_infos: Iterable[Any] | None = None, seconds: Iterable[float | None] | None = None,
                   reward_infos: Iterable[dict[str, Any]] | None = None, texts: bool = True) -> list[dict[str, Any]]:
    """Our keys of each sample's dump row (``DUMP_COLUMNS``), from its unpadded tokens and what
    verl keeps beside them; ``reward_infos``: the reward function's other values, for a dump
    that lacks them. With ``texts``, each response token decoded alone, for the rows without our
    agent loop's record (which has its own)."""
    count = len(prompts)
    data_sources = list(data_sources) if data_sources is not None else [None] * count
    extra_infos = list(extra_infos) if extra_infos is not None else [None] * count
    seconds = list(seconds) if seconds is not None else [None] * count
    reward_infos = list(reward_infos) if reward_infos is not None else [{}] * count
    rows = []
    for i in range(count):
        row = dict(reward_infos[i] or {})
        row.update({DUMP_PROMPT_IDS: prompts[i], DUMP_RESPONSE_IDS: responses[i], DUMP_RESPONSE_MASK: masks[i]})
        if logprobs is not None:
            row[DUMP_LOGPROBS] = logprobs[i]
        if texts and EPISODE_RECORD_KEY not in row:
            row[DUMP_TOKEN_TEXTS] = token_pieces(tokenizer, responses[i])
        if data_sources[i] is not None:
            row[DUMP_DATA_SOURCE] = str(data_sources[i])
        index = extra_infos[i].get("index") if isinstance(extra_infos[i], dict) else None
        if index is not None:
            row[DUMP_ROW_INDEX] = int(index)
        if seconds[i] is not None:
            row[DUMP_GENERATION_SECONDS] = float(seconds[i])
        rows.append(row)
    return rows


def with_columns(reward_extra_infos: dict[str, list], rows: list[dict[str, Any]]) -> dict[str, list]:
    """verl's ``reward_extra_infos_dict`` of a dump with our rows' keys added as columns (None
    where a row lacks one); verl's own keys, and the reward values it already has, are kept."""
    keys = dict.fromkeys(key for row in rows for key in row)
    added = {key: [row.get(key) for row in rows] for key in keys
             if key not in VERL_DUMP_KEYS and key not in reward_extra_infos}
    return {**reward_extra_infos, **added}


def transfer_queue_rows(data: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """Our keys of each sample, from verl's TransferQueue fields of a training batch as
    ``tq.kv_batch_get`` returns them (a TensorDict: tokens as jagged nested tensors, one row per
    sample, unpadded; ``metrics`` and ``extra_fields`` as lists of dicts)."""
    present = set(data.keys())
    masks = _token_rows(data["response_mask"])
    metrics = _objects(data["metrics"]) if "metrics" in present else [None] * len(masks)
    extra_fields = _objects(data["extra_fields"]) if "extra_fields" in present else [None] * len(masks)
    return sample_columns(
        _token_rows(data["prompts"]), _token_rows(data["responses"]), masks,
        _token_rows(data["rollout_log_probs"]) if "rollout_log_probs" in present else None, tokenizer,
        data_sources=_objects(data["data_source"]) if "data_source" in present else None,
        extra_infos=_objects(data["extra_info"]) if "extra_info" in present else None,
        seconds=[m.get("generate_sequences") if isinstance(m, dict) else None for m in metrics],
        reward_infos=[f.get("reward_extra_info") or {} if isinstance(f, dict) else {} for f in extra_fields],
    )


def dataproto_rows(batch: DataProto, tokenizer: Any, texts: bool = True,
                   non_tensor: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Our keys of each sample of a batch of verl's legacy trainer (a ``DataProto``: prompts padded
    on the left, responses on the right to the batch's widths, ``attention_mask`` over both);
    ``texts``: decode each response token (``sample_columns``); ``non_tensor``: the samples'
    ``data_source`` and ``extra_info`` where the batch lacks them."""
    tensors = batch.batch
    prompts, responses = tensors["prompts"], tensors["responses"]
    width = prompts.shape[1]
    attention = tensors["attention_mask"].bool()
    lengths = attention[:, width:].sum(dim=1).tolist()
    masks = tensors["response_mask"]
    logprobs = tensors["rollout_log_probs"] if "rollout_log_probs" in tensors.keys() else None
    non_tensor = {**(non_tensor or {}), **batch.non_tensor_batch}
    seconds = non_tensor.get(DUMP_GENERATION_SECONDS)
    return sample_columns(
        [prompts[i][attention[i, :width]].tolist() for i in range(len(lengths))],
        [responses[i, :n].tolist() for i, n in enumerate(lengths)],
        [masks[i, :n].tolist() for i, n in enumerate(lengths)],
        None if logprobs is None else [logprobs[i, :n].tolist() for i, n in enumerate(lengths)],
        tokenizer,
        data_sources=_objects(non_tensor["data_source"]) if "data_source" in non_tensor else None,
        extra_infos=_objects(non_tensor["extra_info"]) if "extra_info" in non_tensor else None,
        seconds=None if seconds is None else _objects(seconds),
        texts=texts,
    )


def _token_rows(value: Any) -> list[list]:
    """Each sample's row of a tensor field: of a nested tensor (TransferQueue packs a tensor field
    so), a dense one, or a ``NonTensorStack`` of tensors (its packing when some sample has None)."""
    if isinstance(value, torch.Tensor):
        rows = value.unbind() if value.is_nested else list(value)
    else:
        rows = _objects(value)
    return [row.tolist() if isinstance(row, torch.Tensor) else [] for row in rows]


def _objects(value: Any) -> list:
    return list(value.tolist()) if hasattr(value, "tolist") else list(value)


class DumpsTokens:
    """verl's default trainer (``trainer_base.PPOTrainer``) with our keys in its training and
    validation dumps.

    verl's ``_log_rollout_data`` reads the step's text from its TransferQueue and hands the rows,
    sorted by key, to ``_dump_generations`` with the keys as ``uid``; our rows are read from the
    TransferQueue first, by key, and joined to verl's there.

    verl's ``_validate`` samples each validation batch from its replay buffer (partition "val"),
    reads the batch's text and clears it from the TransferQueue before the next, and dumps every
    batch's rows at the end, keyed as a training dump is. While it validates, its replay buffer is
    ``ValidationSampler``: each validation batch's rows are read as it is sampled, before verl
    clears it, and joined to verl's dump by key the same way."""

    _rows_by_key: dict[str, dict[str, Any]] = {}
    _val_rows_by_key: dict[str, dict[str, Any]] = {}

    def _log_rollout_data(self, batch: Any, timing_raw: dict, rollout_data_dir: str) -> None:
        try:
            self._rows_by_key = dict(zip(batch.keys, transfer_queue_rows(_fetch(batch), self.tokenizer)))
        except Exception:  # noqa: BLE001 (our columns must never stop verl's dump or its training)
            logger.exception("verl dump: step %s is dumped without its tokens", getattr(self, "global_steps", "?"))
        try:
            super()._log_rollout_data(batch, timing_raw, rollout_data_dir)
        finally:
            self._rows_by_key = {}

    def _validate(self) -> dict[str, float]:
        sampler = self.replay_buffer
        self._val_rows_by_key = {}
        self.replay_buffer = ValidationSampler(sampler, self._keep_validation_rows)
        try:
            return super()._validate()
        finally:
            self.replay_buffer = sampler
            self._val_rows_by_key = {}

    def _keep_validation_rows(self, batch: Any) -> None:
        try:
            self._val_rows_by_key.update(zip(batch.keys, transfer_queue_rows(_fetch(batch), self.tokenizer)))
        except Exception:  # noqa: BLE001 (our columns must never stop verl's validation)
            logger.exception("verl dump: validation at step %s is dumped without its tokens",
                             getattr(self, "global_steps", "?"))

    def _dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        keys = reward_extra_infos_dict.get("uid")
        if (self._rows_by_key or self._val_rows_by_key) and keys is not None:
            rows = [self._rows_by_key.get(str(key)) or self._val_rows_by_key.get(str(key)) or {} for key in keys]
            reward_extra_infos_dict = with_columns(reward_extra_infos_dict, rows)
        super()._dump_generations(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)


class ValidationSampler:
    """verl's replay buffer (``trainer_base.PPOTrainer.replay_buffer``, verl's or a custom one)
    while verl validates: what it samples is verl's; each batch of the "val" partition is handed to
    ``keep(batch)`` first (its samples are in the TransferQueue until verl clears them after reading
    its text). Everything else is the replay buffer's own."""

    def __init__(self, sampler: Any, keep: Any) -> None:
        self._sampler, self._keep = sampler, keep

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        batch, metrics = self._sampler.sample(*args, **kwargs)
        if getattr(batch, "partition_id", None) == "val":
            self._keep(batch)
        return batch, metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)


def _fetch(batch: Any) -> dict[str, Any]:
    """The batch's fields our rows are made of, from verl's TransferQueue (where verl's own
    ``_log_rollout_data`` reads its text), each optional one where the batch has it."""
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(TRANSFER_QUEUE_FIELDS))
    fields = {name: data[name] for name in data.keys()}
    for name in OPTIONAL_TRANSFER_QUEUE_FIELDS:
        try:
            optional = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[name])
        except ValueError:  # TransferQueue: the field is not there (not ready) for these keys
            continue
        if name in optional.keys():
            fields[name] = optional[name]
    return fields


class LegacyDumpsTokens:
    """verl's legacy trainer (``RayPPOTrainer``) with our keys in its training and validation
    dumps: verl's ``_log_rollout_data`` gets the batch's reward values with our rows' keys added, in
    batch order.

    verl's ``_validate`` keeps only each validation batch's text and reward values, and dumps them
    all at the end, in batch order. While it validates, its rollout manager is
    ``ValidationGenerator``: each batch it generates gives our rows (without the rows verl pads the
    batch with, ``pad_dataproto_to_divisor``: verl's ``_get_gen_batch`` is handed the batch before
    it is padded, and its size is kept there), and verl's dump of them all gets our keys in order."""

    _val_rows: list[dict[str, Any]] | None = None
    _val_sizes: list[int] = []

    def init_workers(self) -> None:
        super().init_workers()
        keep_sample_seconds(self.async_rollout_manager)

    def _log_rollout_data(self, batch: DataProto, reward_extra_infos_dict: dict, timing_raw: dict,
                          rollout_data_dir: str) -> None:
        try:
            rows = dataproto_rows(batch, self.tokenizer, texts=EPISODE_RECORD_KEY not in reward_extra_infos_dict)
            reward_extra_infos_dict = with_columns(dict(reward_extra_infos_dict), rows)
        except Exception:  # noqa: BLE001 (our columns must never stop verl's dump or its training)
            logger.exception("verl dump: step %s is dumped without its tokens", getattr(self, "global_steps", "?"))
        super()._log_rollout_data(batch, reward_extra_infos_dict, timing_raw, rollout_data_dir)

    def _validate(self, merged: bool = False):
        manager = self.async_rollout_manager
        self._val_rows, self._val_sizes = [], []
        self.async_rollout_manager = ValidationGenerator(manager, self._keep_generated)
        try:
            return super()._validate(merged)
        finally:
            self.async_rollout_manager = manager
            self._val_rows, self._val_sizes = None, []

    def _get_gen_batch(self, batch: DataProto) -> DataProto:
        if self._val_rows is not None:
            self._val_sizes.append(len(batch))
        return super()._get_gen_batch(batch)

    def _keep_generated(self, inputs: DataProto, outputs: DataProto) -> None:
        size = self._val_sizes.pop(0) if self._val_sizes else len(outputs)
        if self._val_rows is None:
            return
        try:
            self._val_rows.extend(dataproto_rows(outputs[:size], self.tokenizer, non_tensor={
                name: inputs.non_tensor_batch[name][:size] for name in ("data_source", "extra_info")
                if name in inputs.non_tensor_batch}))
        except Exception:  # noqa: BLE001 (our columns must never stop verl's validation)
            logger.exception("verl dump: validation at step %s is dumped without its tokens",
                             getattr(self, "global_steps", "?"))
            self._val_rows = None

    def _dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        rows = self._val_rows
        if rows is not None and len(rows) == len(inputs):
            if EPISODE_RECORD_KEY in reward_extra_infos_dict:  # our agent loop's record has its own
                rows = [{k: v for k, v in row.items() if k != DUMP_TOKEN_TEXTS} for row in rows]
            reward_extra_infos_dict = with_columns(dict(reward_extra_infos_dict), rows)
        elif rows is not None:
            logger.error("verl dump: validation at step %s is dumped without its tokens (%d rows, %d generated)",
                         getattr(self, "global_steps", "?"), len(inputs), len(rows))
        super()._dump_generations(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)


def keep_sample_seconds(manager: Any) -> None:
    """Each generated batch of verl's rollout manager (``AgentLoopManager``) keeps its samples' own
    generation times (``AgentLoopMetrics.generate_sequences``) as ``DUMP_GENERATION_SECONDS`` of its
    ``non_tensor_batch``: verl's legacy trainer folds them into the step's timing
    (``_performance_metrics``, handed each worker's chunk of metrics in the order the chunks were
    concatenated) and drops them before it dumps. A manager of another kind (verl's
    ``agent_loop_manager_class``) is left as it is: its samples are dumped without their times."""
    measure = getattr(manager, "_performance_metrics", None)
    if measure is None:
        return

    def performance_metrics(metrics: list[list[dict[str, Any]]], output: DataProto) -> dict[str, Any]:
        seconds = [sample.get("generate_sequences") if isinstance(sample, dict) else None
                   for chunk in metrics for sample in chunk]
        if len(seconds) == len(output):
            output.non_tensor_batch[DUMP_GENERATION_SECONDS] = np.array(seconds, dtype=object)
        else:  # another layout than verl 0.9.1's: the dump goes without the times, never with the wrong ones
            logger.error("verl dump: %d generation times for %d samples; dumped without them", len(seconds), len(output))
        return measure(metrics, output)

    manager._performance_metrics = performance_metrics


class ValidationGenerator:
    """verl's rollout manager (``RayPPOTrainer.async_rollout_manager``) while verl's legacy trainer
    validates: what it generates is verl's; each batch and what was generated of it is handed to
    ``keep(batch, generated)`` first. Everything else is the manager's own."""

    def __init__(self, manager: Any, keep: Any) -> None:
        self._manager, self._keep = manager, keep

    def generate_sequences(self, batch: DataProto, *args: Any, **kwargs: Any) -> DataProto:
        generated = self._manager.generate_sequences(batch, *args, **kwargs)
        self._keep(batch, generated)
        return generated

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)


def dumping_trainer(trainer_cls: type) -> type:
    """verl's trainer class ``trainer_cls`` (default or legacy) with our keys in its dumps."""
    mixin = DumpsTokens if issubclass(trainer_cls, trainer_base.PPOTrainer) else LegacyDumpsTokens
    if issubclass(trainer_cls, mixin):
        return trainer_cls
    return type(trainer_cls.__name__, (mixin, trainer_cls), {"__module__": __name__, "__doc__": trainer_cls.__doc__})


class _TaskRunner:
    """verl's TaskRunnerV1 (run inside this actor), training with the mode's trainer class made
    ``dumping_trainer``.

    verl's ``run`` looks its trainer class up by ``trainer.v1.trainer_mode`` in its registry, and
    the trainer branches on the mode's name ("sync"), so ours takes that name's entry: in verl's
    TaskRunner actor, a process of its own. (verl's runner is held, not subclassed: Ray's pickling
    of a subclass of an actor class breaks the legacy runner's ``super()``.)"""

    def __init__(self) -> None:
        self.runner = TaskRunnerV1.__ray_actor_class__()

    def run(self, config: Any) -> None:
        mode = config.trainer.v1.trainer_mode
        trainer_base.TRAINER_REGISTRY[mode] = dumping_trainer(trainer_base.get_trainer_cls(mode))
        return self.runner.run(config)


class _LegacyTaskRunner:
    """verl's legacy TaskRunner (run inside this actor), training with
    ``dumping_trainer(RayPPOTrainer)``: its ``run`` builds the trainer by the name ``RayPPOTrainer``
    of its module (in verl's TaskRunner actor, a process of its own)."""

    def __init__(self) -> None:
        self.runner = main_ppo_v0.TaskRunner.__ray_actor_class__()

    def run(self, config: Any) -> None:
        main_ppo_v0.RayPPOTrainer = dumping_trainer(RayPPOTrainer)
        return self.runner.run(config)


TASK_RUNNER = ray.remote(_TaskRunner)
LEGACY_TASK_RUNNER = ray.remote(_LegacyTaskRunner)


def task_runner(use_v1: bool) -> Any:
    """verl's TaskRunner actor class for ``trainer.use_v1``, its dumps with our keys."""
    return TASK_RUNNER if use_v1 else LEGACY_TASK_RUNNER
