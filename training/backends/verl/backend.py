"""The ``verl`` backend: verl's own PPO trainer on Ray, from one GPU to many nodes.

Nothing of verl is copied here; this module translates between our world and verl's API:

- ``compose_verl_config`` composes verl's Hydra config (``verl/trainer/config/ppo_trainer.yaml``),
  maps our keys onto verl's, applies verl-native overrides and validates the result with verl's
  own checks (``verl.utils.config.validate_config`` and its config dataclasses).
- ``write_verl_parquet`` writes tasks in the parquet layout verl's ``RLHFDataset`` reads.
- ``compute_score`` is our reward functions behind verl's custom reward function signature.
- multi-turn agents run in ``training.backends.verl.agent_loop.AgentTrainerLoop``, a verl agent loop.
- ``VerlMetricsBridge`` routes what verl's ``Tracking`` writes (its ``file`` backend) into our sinks,
  and the episodes of verl's rollout dumps into the episode store; verl trains with its own trainer
  class made to add to those dumps what they leave out (``training.backends.verl.dumps``).

verl is imported inside functions, so importing this module stays cheap and works without verl.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from training.backends.base import BuiltinProcessor, TrainResult
from training.config import Config, ConfigInput, close_key, flatten, parse_overrides, valid_keys
from training.errors import ConfigError, RunSuperseded, TrainingFailed
from training.log import logger
from training.rollouts.outcomes import OutcomeMonitor
from training.algorithms.recipes import clip_range
from training.rewards import RewardFunction, load_reward
from training.tracking.episodes import TRAIN, VALIDATION, episode_record, keep_for_store
from training.tracking.sinks import MultiSink
from training.tracking.trackers import VERL_TRACKERS, verl_tracker_names, verl_tracking_environment
from training.types import Episode, Step, TerminationReason, Trajectory
from training.backends.verl.names import VERL_FILLED_LATER, verl_default_config, verl_keys
from training.utils import checkpoint_step, cuda_device_count, is_verl_available
from training.data import dataset_to_tasks

NO_GPU_MESSAGE = (
    "the verl backend needs CUDA GPUs; this worker has none; choose trl "
    "(train_engine_name='trl' or backend='auto')."
)
AGENT_LOOP_NAME = "agent_trainer"
SINGLE_TURN_LOOP_NAME = "single_turn_agent"  # verl's own single-turn agent loop
AGENT_LOOP_MODULE = "training.backends.verl.agent_loop"
REWARD_MODULE = "pkg://training.backends.verl.backend"
# verl writes this beside its global_step_N folders once step N is saved whole.
VERL_LATEST = "latest_checkpointed_iteration.txt"
# Config groups of verl's defaults list: they pick other YAML files, so they must be set at compose time.
_HYDRA_GROUPS = ("model_engine",)
# Without a chat template (the tiny character model) the prompt is the messages' text, as in
# training.rendering.render_messages; verl's agent loops need a template, so give it this one.
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"

# verl's metric names -> the headline names our dashboard shows (verl's names are kept too).
VERL_METRIC_NAMES = {
    "critic/score/mean": "reward",
    "actor/pg_loss": "loss",
    "actor/kl_loss": "kl",
    "actor/entropy": "entropy",
    "actor/grad_norm": "grad_norm",
    "actor/lr": "lr",
    "response_length/mean": "response_length",
    "response_length/clip_ratio": "clipped_ratio",
    "num_turns/mean": "turns",
    "timing_s/step": "step_time",
}
SAMPLE_EPISODES_PER_STEP = 4
# The key of verl's ``reward_extra_info`` (so of each rollout dump row) that carries the episode
# store's record from our agent loop, as JSON text: verl stacks each key's values into one numpy
# array per batch, and lists of different lengths (token ids) would not stack.
EPISODE_RECORD_KEY = "episode_record"
# A dump with fewer rows than a step has is read again for this long (verl may still be writing it;
# a filtered batch stays short).
DUMP_SETTLE_SECONDS = 10.0
# Keys our verl job adds to each row verl dumps (``training.backends.verl.dumps``), beside verl's own:
# the tokens verl trained on (unpadded; the response mask as verl trained with it), the rollout's
# log-probabilities where verl computed them, each response token decoded alone (rows without our
# agent loop's record), the row's data source and dataset row, and verl's own time generating the
# sample (``AgentLoopMetrics.generate_sequences``; verl's default trainer only).
DUMP_PROMPT_IDS, DUMP_RESPONSE_IDS, DUMP_RESPONSE_MASK = "prompt_ids", "response_ids", "response_mask"
DUMP_LOGPROBS, DUMP_TOKEN_TEXTS = "rollout_log_probs", "token_texts"
DUMP_DATA_SOURCE, DUMP_ROW_INDEX, DUMP_GENERATION_SECONDS = "data_source", "row_index", "generation_seconds"
DUMP_COLUMNS = (DUMP_PROMPT_IDS, DUMP_RESPONSE_IDS, DUMP_RESPONSE_MASK, DUMP_LOGPROBS, DUMP_TOKEN_TEXTS,
                DUMP_DATA_SOURCE, DUMP_ROW_INDEX, DUMP_GENERATION_SECONDS)
# Keys of a rollout dump row that are verl's or ours, not reward components (a validation dump
# repeats the score as ``reward``; verl's default trainer names each sample by its TransferQueue
# key ``<uid>_<session>_<index>`` in ``uid``).
_DUMP_KEYS = {"input", "output", "gts", "score", "reward", "step", "uid", "request_id", "termination_reason", "error",
              "traceback", EPISODE_RECORD_KEY, *DUMP_COLUMNS}
# verl estimators whose advantages depend on how many tokens each episode trained on (a length-weighted
# baseline, a whitening over the batch's tokens): rows dumped without their token mask (a dump our
# columns could not be added to, ``training.backends.verl.dumps``) cannot have them recomputed.
_TOKEN_COUNT_ESTIMATORS = {"opo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"}


# -- configuration ---------------------------------------------------------------------------


def split_overrides(config: ConfigInput) -> tuple[ConfigInput, dict[str, Any]]:
    """Split the user's overrides into ours (``Config`` keys) and verl-native ones.

    A key known to neither raises ``ConfigError`` naming the nearest key of either; a key with a
    leading ``+`` is added to verl's config as in Hydra (for free-form dicts such as engine_kwargs).
    """
    if config is None or isinstance(config, Config):
        return config, {}
    ours_valid = set(valid_keys())
    ours: dict[str, Any] = {}
    native: dict[str, Any] = {}
    verl = None
    for key, value in parse_overrides(config).items():
        if key in ours_valid:
            ours[key] = value
            continue
        if value is None and key in VERL_FILLED_LATER:  # AWorld's placeholders: the run fills them in below
            logger.info("%s=null: %s fills it", key, VERL_FILLED_LATER[key])
            continue
        verl = verl if verl is not None else verl_keys()
        if key.startswith("+") or key in verl or key in _HYDRA_GROUPS:
            native[key] = value
            continue
        raise _unknown_verl_key(key, ours_valid | verl)
    return ours, native


def _unknown_verl_key(key: str, known: set[str]) -> ConfigError:
    close = close_key(key, sorted(known))
    hint = f" Did you mean '{close}'?" if close else ""
    return ConfigError(key, f"unknown config key: neither ours nor verl's PPO trainer config has it.{hint}")


def _our_keys_in_verl(config: Config, run_path: Path) -> dict[str, Any]:
    """Our Config as verl paths. Keys named alike carry over; the rest are mapped here."""
    data, model = config.data, config.actor_rollout_ref.model
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    algorithm, trainer = config.algorithm, config.trainer
    checkpoints = trainer.default_local_dir or str(run_path / "checkpoints")
    keys: dict[str, Any] = {
        "data.train_batch_size": data.train_batch_size,
        "data.max_prompt_length": data.max_prompt_length,
        "data.max_response_length": data.max_response_length,
        "data.shuffle": data.shuffle,
        "data.seed": trainer.seed,
        "data.trust_remote_code": model.trust_remote_code,
        "actor_rollout_ref.model.path": model.path,
        "actor_rollout_ref.model.tokenizer_path": model.tokenizer_path,
        "actor_rollout_ref.model.trust_remote_code": model.trust_remote_code,
        "actor_rollout_ref.model.lora_rank": model.lora_rank,
        "actor_rollout_ref.model.enable_gradient_checkpointing": model.enable_gradient_checkpointing,
        "actor_rollout_ref.model.lora_alpha": model.lora_alpha,
        "actor_rollout_ref.model.target_modules": model.target_modules,
        "actor_rollout_ref.model.exclude_modules": model.exclude_modules,
        "actor_rollout_ref.actor.optim.lr": actor.optim.lr,
        "actor_rollout_ref.actor.optim.weight_decay": actor.optim.weight_decay,
        "actor_rollout_ref.actor.optim.lr_warmup_steps": actor.optim.lr_warmup_steps,
        "actor_rollout_ref.actor.optim.lr_scheduler_type": actor.optim.lr_scheduler_type,
        "actor_rollout_ref.actor.ppo_mini_batch_size": actor.ppo_mini_batch_size or data.train_batch_size,
        "actor_rollout_ref.actor.ppo_epochs": actor.ppo_epochs,
        "actor_rollout_ref.actor.clip_ratio": actor.clip_ratio,
        "actor_rollout_ref.actor.clip_ratio_low": clip_range(config)[0],
        "actor_rollout_ref.actor.clip_ratio_high": clip_range(config)[1],
        "actor_rollout_ref.actor.loss_agg_mode": actor.loss_agg_mode,
        "actor_rollout_ref.actor.policy_loss.loss_mode": actor.policy_loss.loss_mode,
        "actor_rollout_ref.actor.entropy_coeff": actor.entropy_coeff,
        "actor_rollout_ref.actor.use_kl_loss": actor.use_kl_loss,
        "actor_rollout_ref.actor.kl_loss_coef": actor.kl_loss_coef,
        "actor_rollout_ref.actor.grad_clip": actor.grad_clip,
        # Token-budgeted micro-batches: always valid for any batch size and GPU count.
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": max(16384, 2 * (data.max_prompt_length + data.max_response_length)),
        "actor_rollout_ref.actor.fsdp_config.seed": trainer.seed,
        "actor_rollout_ref.rollout.n": rollout.n,
        "actor_rollout_ref.rollout.temperature": rollout.temperature,
        "actor_rollout_ref.rollout.top_p": rollout.top_p,
        "actor_rollout_ref.rollout.top_k": rollout.top_k,
        "actor_rollout_ref.rollout.name": rollout.name,
        "actor_rollout_ref.rollout.gpu_memory_utilization": rollout.gpu_memory_utilization,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": rollout.tensor_model_parallel_size,
        "actor_rollout_ref.rollout.dtype": model.dtype,
        "actor_rollout_ref.rollout.seed": trainer.seed,
        "actor_rollout_ref.rollout.val_kwargs.temperature": rollout.val_kwargs.temperature,
        "actor_rollout_ref.rollout.val_kwargs.top_p": rollout.val_kwargs.top_p,
        "actor_rollout_ref.rollout.val_kwargs.top_k": rollout.val_kwargs.top_k,
        "actor_rollout_ref.rollout.val_kwargs.n": rollout.val_kwargs.n,
        "actor_rollout_ref.rollout.val_kwargs.do_sample": rollout.val_kwargs.do_sample,
        "algorithm.adv_estimator": algorithm.adv_estimator,
        "algorithm.norm_adv_by_std_in_grpo": algorithm.norm_adv_by_std_in_grpo,
        "algorithm.gamma": algorithm.gamma,
        "algorithm.filter_groups.enable": algorithm.filter_groups.enable,
        "trainer.total_training_steps": trainer.total_training_steps,
        "trainer.total_epochs": trainer.total_epochs,
        "trainer.save_freq": trainer.save_freq,
        "trainer.test_freq": trainer.test_freq,
        "trainer.val_before_train": trainer.val_before_train,
        "trainer.resume_mode": trainer.resume_mode,
        "trainer.project_name": trainer.project_name,
        "trainer.experiment_name": trainer.experiment_name,
        "trainer.nnodes": trainer.nnodes,
        "trainer.n_gpus_per_node": trainer.n_gpus_per_node,
        "trainer.default_local_dir": checkpoints,
        "trainer.max_actor_ckpt_to_keep": trainer.max_checkpoints or None,
        "trainer.device": "cuda",
        # verl's Tracking writes every step to a JSONL file (its "file" backend) that the
        # metrics bridge reads into our sinks; our console sink prints the headline. The external
        # trackers the user named are verl's own (training/tracking/trackers.py says where they write).
        "trainer.logger": ["file", *verl_tracker_names(config)],
        "trainer.rollout_data_dir": str(run_path / "verl_rollouts"),
        "trainer.validation_data_dir": str(run_path / "verl_validation"),
    }
    overlong = config.reward_model.overlong_buffer
    if overlong.enable:  # verl's DAPO reward manager applies the soft overlong punishment
        keys["reward.reward_manager.name"] = "dapo"
        keys["+reward.reward_kwargs.max_resp_len"] = data.max_response_length
        keys["+reward.reward_kwargs.overlong_buffer_cfg"] = {
            "enable": True, "len": overlong.len, "penalty_factor": overlong.penalty_factor, "log": False,
        }
    if trainer.ray_address is not None:  # ray_init holds ray.init's keyword arguments
        keys["+ray_kwargs.ray_init.address"] = trainer.ray_address
    if model.path == "tiny-char":
        keys["actor_rollout_ref.model.path"] = str(run_path / "tiny_model")
    return keys


def compose_verl_config(
    config: Config,
    verl_overrides: dict[str, Any] | None = None,
    *,
    run_path: str | Path = ".",
    train_files: str | None = None,
    val_files: str | None = None,
    agent_kind: str = "single_turn",
    agent_payload: str | None = None,
    reward_kwargs: dict[str, Any] | None = None,
    validate: bool = True,
):
    """verl's PPO trainer config with our run config and the user's verl-native overrides applied.

    Layers, later wins: verl's defaults, our ``config`` mapped onto verl's keys, what this run
    wires up (data files, agent loop, reward function), then ``verl_overrides``. The result is
    checked by verl's own ``validate_config`` and config dataclasses; a problem raises
    ``ConfigError`` naming the verl path.
    """
    run_path = Path(run_path)
    native = dict(verl_overrides or {})
    groups = {key: str(native.pop(key)) for key in _HYDRA_GROUPS if key in native}
    verl = verl_default_config(groups)

    layers = _our_keys_in_verl(config, run_path)
    if train_files is not None:
        layers["data.train_files"] = train_files
        layers["data.val_files"] = val_files or train_files
    if val_files is None:
        layers["trainer.val_before_train"] = False
    multi_turn = agent_kind != "single_turn"
    layers["actor_rollout_ref.rollout.agent.default_agent_loop"] = AGENT_LOOP_NAME if multi_turn else SINGLE_TURN_LOOP_NAME
    if multi_turn:
        # The agent loop workers import this module, whose @register puts our loop in verl's registry.
        layers["actor_rollout_ref.model.external_lib"] = AGENT_LOOP_MODULE
    if config.actor_rollout_ref.model.path == "tiny-char":
        layers["actor_rollout_ref.model.custom_chat_template"] = PLAIN_CHAT_TEMPLATE
    if reward_kwargs is not None:
        layers["reward.custom_reward_function.path"] = REWARD_MODULE
        layers["reward.custom_reward_function.name"] = "compute_score"
        layers["+reward.custom_reward_function.reward_kwargs"] = reward_kwargs
    if agent_payload is not None:
        # What the agent loop runs (AgentSpec, reward function, our Config), for the Ray workers.
        layers["+agent_trainer.payload"] = agent_payload

    present = verl_keys(verl)
    for key, value in layers.items():
        if not key.startswith("+") and key not in present:  # another engine's config (e.g. megatron) lacks it
            logger.warning("verl config %s has no %s; our value %r is not applied", groups or "default", key, value)
            continue
        _set_verl_key(verl, key, value)
    for key, value in native.items():
        _set_verl_key(verl, key, value)
    if validate:
        validate_verl_config(verl)
    return verl


def _set_verl_key(verl: Any, key: str, value: Any) -> None:
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    add = key.startswith("+")
    key = key.lstrip("+")
    try:
        if add:
            with open_dict(verl):
                OmegaConf.update(verl, key, value, merge=False, force_add=True)
        else:
            OmegaConf.update(verl, key, value, merge=False)
    except OmegaConfBaseException as exc:
        raise _unknown_verl_key(key, verl_keys(verl)) from exc


def validate_verl_config(verl: Any) -> None:
    """verl's own checks: ``validate_config`` (actor, critic, batch sizes against GPUs), the
    algorithm and rollout dataclasses, and the advantage estimator registry."""
    from omegaconf import OmegaConf

    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    if OmegaConf.is_missing(verl.actor_rollout_ref.rollout, "name"):
        raise ConfigError("actor_rollout_ref.rollout.name", "verl needs a rollout engine: vllm or sglang.")
    checks: list[tuple[str, Callable[[], Any]]] = [
        ("algorithm.adv_estimator", lambda: get_adv_estimator_fn(verl.algorithm.adv_estimator)),
        ("algorithm", lambda: omega_conf_to_dataclass(verl.algorithm)),
        ("actor_rollout_ref.rollout", lambda: omega_conf_to_dataclass(verl.actor_rollout_ref.rollout)),
        (
            "config",
            lambda: validate_config(
                verl, use_reference_policy=need_reference_policy(verl), use_critic=need_critic(verl)
            ),
        ),
    ]
    for where, check in checks:
        printed = io.StringIO()  # validate_config prints its verdict and warns; keep it out of our output
        try:
            with contextlib.redirect_stdout(printed), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check()
        except Exception as exc:  # verl reports problems as AssertionError, ValueError, KeyError...
            raise ConfigError(where, f"verl rejected the composed config: {exc}") from exc
        logger.debug("verl check %s: %s", where, printed.getvalue().strip())


# -- data ------------------------------------------------------------------------------------


def _as_messages(prompt: Any) -> list[dict[str, str]]:
    if prompt is None:
        return [{"role": "user", "content": ""}]
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "content" in m for m in prompt):
        return [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in prompt]
    raise ValueError(f"a prompt must be text or a list of chat messages with 'content', got {prompt!r:.200}.")


def task_to_verl_row(
    task: dict, index: int, *, split: str, agent_name: str, prompt_key: str = "prompt", answer_key: str = "ground_truth"
) -> dict[str, Any]:
    """One task as a row of verl's RLHFDataset: data_source, prompt (chat messages), ability,
    reward_model.ground_truth, extra_info, agent_name. The whole task travels as JSON in
    ``extra_info.task`` so that rewards and agents get it back unchanged."""
    truth = task.get(answer_key)
    return {
        "data_source": str(task.get("data_source", "agent_trainer")),
        "prompt": _as_messages(task.get(prompt_key)),
        "ability": str(task.get("ability", "agent")),
        "reward_model": {"style": "rule", "ground_truth": "" if truth is None else str(truth)},
        "extra_info": {"index": index, "split": split, "task": json.dumps(task, default=str)},
        "agent_name": agent_name,
    }


def write_verl_parquet(
    tasks: list[dict],
    path: str | Path,
    *,
    split: str = "train",
    agent_name: str = SINGLE_TURN_LOOP_NAME,
    prompt_key: str = "prompt",
    answer_key: str = "ground_truth",
) -> Path:
    """Write ``tasks`` (dataset rows) as a parquet file verl's RLHFDataset reads."""
    import datasets

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        task_to_verl_row(task, i, split=split, agent_name=agent_name, prompt_key=prompt_key, answer_key=answer_key)
        for i, task in enumerate(tasks)
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def task_from_extra_info(extra_info: Any) -> dict:
    """The task a verl row carries (see ``task_to_verl_row``); without one, ``extra_info`` itself."""
    extra_info = dict(extra_info or {})
    encoded = extra_info.get("task")
    return json.loads(encoded) if isinstance(encoded, str) else extra_info


# -- rewards ---------------------------------------------------------------------------------


def encode_object(value: Any) -> str:
    """``value`` cloudpickled and base64-encoded, to travel inside verl's config to Ray workers.
    Importable classes and functions are pickled by reference, notebook ones by value."""
    import cloudpickle

    return base64.b64encode(cloudpickle.dumps(value)).decode("ascii")


@functools.lru_cache(maxsize=8)
def decode_object(encoded: str) -> Any:
    import cloudpickle

    return cloudpickle.loads(base64.b64decode(encoded))


def verl_reward_function(reward_fn: RewardFunction) -> Callable[..., dict[str, float]]:
    """``reward_fn`` behind verl's custom reward signature
    ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``.

    Returns ``{"score": reward, "acc": 1.0 or 0.0}``, the dict form verl's reward managers read.
    """

    def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **_: Any) -> dict[str, float]:
        task = task_from_extra_info(extra_info)
        task.setdefault("data_source", data_source)
        task.setdefault(reward_fn.answer_key, ground_truth)
        output = reward_fn(task, solution_str)
        return {"score": float(output.reward), "acc": float(output.is_correct)}

    compute_score.__name__ = f"verl_{reward_fn.name}"
    return compute_score


def reward_kwargs_for(reward_spec: Any, answer_key: str) -> dict[str, Any]:
    """What verl passes to ``compute_score`` as ``reward_kwargs``: a name or import path when the
    reward has one, the pickled function otherwise."""
    if isinstance(reward_spec, str):
        return {"reward": reward_spec, "answer_key": answer_key}
    return {"reward_pickle": encode_object(reward_spec), "answer_key": answer_key}


@functools.lru_cache(maxsize=8)
def _reward_from_kwargs(reward: str | None, reward_pickle: str | None, answer_key: str) -> RewardFunction:
    spec = reward if reward is not None else decode_object(reward_pickle)
    return load_reward(spec, answer_key=answer_key)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    reward: str | None = None,
    reward_pickle: str | None = None,
    answer_key: str = "ground_truth",
    **kwargs: Any,
) -> dict[str, float]:
    """verl's custom reward function entry point (``reward.custom_reward_function``), run by
    verl's reward workers. ``reward``/``reward_pickle``/``answer_key`` come from ``reward_kwargs``."""
    if reward is None and reward_pickle is None:
        raise ValueError("compute_score needs reward_kwargs 'reward' or 'reward_pickle' (set by the verl backend).")
    reward_fn = _reward_from_kwargs(reward, reward_pickle, answer_key)
    return verl_reward_function(reward_fn)(data_source, solution_str, ground_truth, extra_info, **kwargs)


# -- metrics ---------------------------------------------------------------------------------


def dashboard_metrics(data: dict[str, Any]) -> dict[str, float]:
    """verl's metrics, numbers only, plus our headline names (``reward``, ``loss``, ...)."""
    out = {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for verl_name, ours in VERL_METRIC_NAMES.items():
        if verl_name in out:
            out.setdefault(ours, out[verl_name])
    if "kl" not in out and "actor/ppo_kl" in out:
        out["kl"] = out["actor/ppo_kl"]
    return out


class VerlMetricsBridge:
    """Reads what verl's ``Tracking`` ``file`` backend writes (one ``{"step", "data"}`` JSON line
    per step, at ``VERL_FILE_LOGGER_PATH``) and the rollouts it dumps to ``trainer.rollout_data_dir``
    (``<step>.jsonl``), and sends them to our sinks, so a verl run shows like any other. With
    ``keep_episodes(step, records, split)`` (the share of a step's records the config keeps), each
    dumped step's episodes go to the episode store too (``rollout_rows_to_records``, with the
    advantages verl trained them with when ``algorithm``, verl's ``algorithm`` config, is given),
    and so do the validation episodes verl dumps to ``trainer.validation_data_dir``
    (``validation_dir``, ``<step>.jsonl`` of the step they were scored at), as split ``val``.
    verl writes a dump in the background: a step whose file has a torn last line or fewer than
    ``rows_per_step`` (``val_rows_per_step``) rows is read again at the next poll (the last poll,
    at ``stop``, takes what is there).

    ``poll`` reads what is new; ``start`` polls on a thread until ``stop``. ``on_poll`` runs after
    each poll (the processor uses it to honour stop requests). With an ``outcomes`` monitor, each
    dumped step's episodes are checked; a step past the error limit is kept in ``failure``.
    """

    def __init__(
        self,
        sinks: MultiSink,
        metrics_path: str | Path,
        rollout_dir: str | Path | None = None,
        interval_s: float = 1.0,
        on_poll: Callable[[], None] | None = None,
        outcomes: OutcomeMonitor | None = None,
        may_forward: Callable[[str], None] | None = None,
        keep_episodes: Callable[[int, list[dict[str, Any]], str], list[dict[str, Any]]] | None = None,
        rows_per_step: int | None = None,
        validation_dir: str | Path | None = None,
        val_rows_per_step: int | None = None,
        algorithm: Any = None,
    ) -> None:
        self.sinks = sinks
        self.keep_episodes = keep_episodes
        self.rows_per_step = rows_per_step
        self.validation_dir = Path(validation_dir) if validation_dir else None
        self.val_rows_per_step = val_rows_per_step
        self.algorithm = algorithm
        self._final = False
        self._first_seen: dict[tuple[str, int], float] = {}
        self.may_forward = may_forward
        self.superseded: RunSuperseded | None = None
        self.metrics_path = Path(metrics_path)
        self.rollout_dir = Path(rollout_dir) if rollout_dir else None
        self.interval_s = interval_s
        self.on_poll = on_poll
        self.outcomes = outcomes
        self.failure: TrainingFailed | None = None
        self.last_step = 0
        self.last_metrics: dict[str, float] = {}
        self._offset = 0
        self._partial = b""
        self._episode_steps_done: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> int:
        """Forward every complete new line; return how many steps were forwarded. With
        ``may_forward``, it is asked first (and raises ``RunSuperseded`` once this process no
        longer owns the run): what it refuses is never forwarded."""
        forwarded = 0
        if self.metrics_path.is_file():
            with open(self.metrics_path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
            lines = (self._partial + chunk).split(b"\n")
            partial = lines.pop()  # an unfinished last line waits for the next poll
            lines = list(filter(bytes.strip, lines))
            if lines and self.may_forward is not None:
                self.may_forward(f"verl's metrics after step {self.last_step}")
            self._offset += len(chunk)
            self._partial = partial
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:  # a bad line must never end training; skip it
                    logger.warning("verl metrics bridge: skipped a malformed line of %s", self.metrics_path)
                    continue
                self._forward(record)
                forwarded += 1
        self._forward_episodes()
        return forwarded

    def _forward(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", self.last_step + 1))
        metrics = dashboard_metrics(record.get("data", {}))
        self.sinks.log_metrics(step, metrics)
        # Validation metrics come as a second record of the same step: keep both in the summary.
        self.last_metrics = {**self.last_metrics, **metrics} if step == self.last_step else metrics
        self.last_step = max(self.last_step, step)

    def _forward_episodes(self) -> None:
        self._forward_dumps(self.rollout_dir, TRAIN, self.rows_per_step)
        if self.keep_episodes is not None:  # validation episodes go to the episode store only
            self._forward_dumps(self.validation_dir, VALIDATION, self.val_rows_per_step)

    def _forward_dumps(self, folder: Path | None, split: str, rows_per_step: int | None) -> None:
        if folder is None or not folder.is_dir():
            return
        for path in sorted(folder.glob("*.jsonl")):
            if not path.stem.isdigit() or (split, int(path.stem)) in self._episode_steps_done:
                continue
            step = int(path.stem)
            if step > self.last_step:  # verl writes the dump in the background; wait for its step
                continue
            if self.may_forward is not None:
                self.may_forward(f"verl's {split} episodes of step {step}")
            rows = _dump_rows(path)
            first_seen = self._first_seen.setdefault((split, step), time.monotonic())
            short = rows_per_step and len(rows or ()) < rows_per_step
            if not self._final and (rows is None or (short and time.monotonic() - first_seen < DUMP_SETTLE_SECONDS)):
                continue  # verl is still writing it
            rows = rows or []
            if self.keep_episodes is not None:
                records = rollout_rows_to_records(rows, step, split, algorithm=self.algorithm)
                self.sinks.store_episodes(step, self.keep_episodes(step, records, split))
            self._episode_steps_done.add((split, step))
            if split == TRAIN:
                self._forward_train_episodes(rows, step)

    def _forward_train_episodes(self, rows: list[dict[str, Any]], step: int) -> None:
        episodes = [rollout_row_to_episode(row) for row in rows]
        self.sinks.log_episodes(step, episodes[:SAMPLE_EPISODES_PER_STEP])
        judged = [episode for episode in episodes if episode["termination_reason"]]  # our agent loop's rows
        if self.outcomes is not None and judged and self.failure is None:
            try:
                self.outcomes.check_episodes(judged, step)
            except TrainingFailed as exc:
                self.failure = exc

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="verl-metrics-bridge", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                try:
                    self.poll()
                finally:
                    if self.on_poll is not None:
                        self.on_poll()
            except RunSuperseded as exc:  # this process no longer owns the run: it forwards nothing more
                logger.error("verl metrics bridge: %s", exc)
                self.superseded = exc
                return
            except Exception:  # a failing sink or file must never end training
                logger.exception("verl metrics bridge: reading %s failed", self.metrics_path)

    def stop(self) -> None:
        """Stop polling and forward what is left; ``RunSuperseded`` when this process lost the run."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.superseded is not None:
            raise self.superseded
        self._final = True
        self.poll()


class VerlCheckpointPublisher:
    """Publishes the checkpoints verl's trainer saves in the attempt's own folder (``global_step_N``,
    whole once its marker file names N) into the run's checkpoint folder, with the marker, through
    ``TrainerProcessor.publish_checkpoint``: only while the attempt owns the run, by a rename. verl
    saves and rotates inside its own folder; what a superseded attempt's verl saves there is never
    published.

    A checkpoint is published only once its step's metrics were forwarded (``forwarded()``, the
    last step the metrics bridge handed to the sinks, which spool it before they return): verl
    saves a step's checkpoint before it logs the step, and an attempt lost between the two would
    leave the next one resuming after a step whose metrics nobody stored."""

    def __init__(self, processor: Any, written_dir: str | Path, forwarded: Callable[[], int]) -> None:
        self.processor = processor
        self.written_dir = Path(written_dir)
        self.forwarded = forwarded
        self.seen: int | None = None

    def poll(self) -> None:
        step = marked_step(self.written_dir)
        folder = self.written_dir / f"global_step_{step}"
        new = step is not None and step != self.seen and step <= self.forwarded() and folder.is_dir()
        if new:
            self.seen = step
        self.processor.publish_checkpoint(folder if new else None, after=self._mark)

    def _mark(self, published: Path) -> None:
        marker = published.parent / VERL_LATEST
        written = marker.with_name(f".{VERL_LATEST}.{os.getpid()}")
        written.write_text(str(checkpoint_step(published.name)))
        os.replace(written, marker)


def _dump_rows(path: Path) -> list[dict[str, Any]] | None:
    """The rows of a rollout dump; None while its last line is torn (verl still writing it)."""
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            return None
    return rows


def episode_for_dump(episode: Episode, *, group: str, data_source: str, row_index: int | None,
                     prompt_ids: list[int], response_ids: list[int], response_mask: list[int],
                     response_logprobs: list[float], token_texts: list[str]) -> str:
    """The episode store's record of one episode our agent loop ran, as JSON text for verl's
    ``reward_extra_info`` (``EPISODE_RECORD_KEY``): its conversation, reward components, timings,
    group (verl's ``uid``), data source and dataset row, and the token ids, mask and
    log-probabilities verl trains on (as handed to verl: truncated to its response length).
    Step and position are the driver's (``rollout_rows_to_records``)."""
    record = episode_record(episode, split=TRAIN, step=0, position=0, group=group, group_position=0, row_index=row_index)
    record.update(
        data_source=data_source or record["data_source"], prompt_ids=[int(t) for t in prompt_ids],
        token_ids=[int(t) for t in response_ids], mask=[int(m) for m in response_mask],
        logprobs=[float(x) for x in response_logprobs], token_texts=list(token_texts),
        prompt_length=len(prompt_ids), response_length=sum(1 for m in response_mask if m),
    )
    return json.dumps(record, default=str)


def rollout_rows_to_records(rows: list[dict[str, Any]], step: int, split: str, algorithm: Any = None) -> list[dict[str, Any]]:
    """One step's rollout (or validation) dump (verl's rows, in its order) as episode store records.
    A row from our agent loop carries its whole record (``episode_for_dump``); a row of verl's own
    single-turn loop has what verl dumps: the prompt and response as text, the score, the ground
    truth and the reward function's other values (as reward components), grouped by verl's ``uid``
    (by their prompt where the row has none), and, in a training dump, what our job adds to verl's
    (``DUMP_COLUMNS``): the token ids, mask and log-probabilities verl trained on, the data source
    and dataset row, and verl's own time generating the sample (the turn's ``generation_seconds``).
    With ``algorithm`` (verl's ``algorithm`` config), a training step's records get the advantage
    verl trained them with (``verl_advantages``)."""
    records: list[dict[str, Any]] = []
    group_sizes: dict[str, int] = {}
    for position, row in enumerate(rows):
        encoded = row.get(EPISODE_RECORD_KEY)
        if isinstance(encoded, str) and encoded:
            record = json.loads(encoded)
        else:
            episode = _row_episode(row)
            components = {k: v for k, v in row.items() if k not in _DUMP_KEYS}
            index = row.get(DUMP_ROW_INDEX)
            record = episode_record(episode, split=split, step=step, position=position, group=_row_group(row),
                                    group_position=0, row_index=None if index is None else int(index),
                                    reward_components=components)
            record["token_texts"] = [str(piece) for piece in row.get(DUMP_TOKEN_TEXTS) or []]
        group = str(record.get("group") or "")
        record.update(split=split, step=int(step), position=position, group_position=group_sizes.get(group, 0))
        group_sizes[group] = record["group_position"] + 1
        records.append(record)
    if algorithm is not None and split == TRAIN:
        try:
            advantages = verl_advantages(rows, records, algorithm)
        except Exception:  # noqa: BLE001 (an estimator that fails on a dump must not keep its step's episodes from the store)
            logger.exception("verl episodes: could not recompute the advantages of step %d; stored without them", step)
            advantages = [None] * len(records)
        for record, advantage in zip(records, advantages):
            record["advantage"] = advantage
    return records


def verl_advantages(rows: list[dict[str, Any]], records: list[dict[str, Any]], algorithm: Any) -> list[float | None]:
    """Each episode's advantage as verl computes it after the dump (which does not carry it): verl's
    own estimator (``training.algorithms.advantages.compute_advantages``: verl's registry, called as
    verl's trainer calls it) on the step's dumped scores, grouped by ``group`` (verl's ``uid``; the
    prompt's text for single-turn rows of verl's legacy trainer, which does not dump it), with the run's
    ``algorithm`` settings; per episode, the mean over its trained tokens (``mask``). None where the
    dump cannot give it: an estimator that needs more than rewards (``gae``'s critic values, ...),
    a KL penalty folded into the reward (``algorithm.use_kl_in_reward``, per token), or an estimator
    that counts tokens (``_TOKEN_COUNT_ESTIMATORS``) for rows dumped without their token mask or
    when verl's rejection sampling (``algorithm.rollout_correction.rollout_rs``) masked tokens out
    first, by log-probabilities the dump does not carry."""
    import numpy as np
    import torch

    from training.algorithms.advantages import NEEDS, compute_advantages  # brings in torch and verl: imported on first use

    # Our agent loop's rows carry their mask, and so do verl's own where our job added its tokens.
    with_masks = bool(records) and all(record.get("mask") for record in records)
    rejection = (getattr(algorithm, "rollout_correction", None) or {}).get("rollout_rs")
    estimator = str(algorithm.adv_estimator)
    if (not records or estimator in NEEDS or getattr(algorithm, "use_kl_in_reward", False)
            or ((rejection or not with_masks) and estimator in _TOKEN_COUNT_ESTIMATORS)):
        return [None] * len(records)
    # Rows without their masks (a dump our columns could not be added to): one trained token each;
    # the estimators left spread one number per episode over its tokens, so its mean over them does
    # not depend on how many there were.
    masks = [list(record.get("mask") or []) if with_masks else [1] for record in records]
    width = max([1, *map(len, masks)])
    response_mask = torch.zeros(len(masks), width)
    sequence_mask = torch.zeros(len(masks), width)
    for i, mask in enumerate(masks):
        response_mask[i, :len(mask)] = torch.tensor(mask, dtype=torch.float32)
        sequence_mask[i, :len(mask)] = 1.0  # verl puts the score on the response's last token
    rewards = torch.tensor([float(row.get("score") or 0.0) for row in rows])
    index = np.array([record["group"] for record in records], dtype=object)
    advantages = compute_advantages(rewards, response_mask, 1, algorithm, sequence_mask=sequence_mask, index=index)
    trained = response_mask.sum(dim=1)
    per_episode = (advantages * response_mask).sum(dim=1) / trained.clamp(min=1)
    return [float(value) if count > 0 else None for value, count in zip(per_episode.tolist(), trained.tolist())]


def _row_group(row: dict[str, Any]) -> str:
    """The row's group: verl's ``uid`` of its prompt, the part of the sample's TransferQueue key
    (``<uid>_<session>_<index>``, dumped as ``uid`` by verl's default trainer) before the session;
    where a row has none (verl's legacy trainer), its prompt's text, hashed."""
    key = row.get("uid")
    if isinstance(key, str) and key.count("_") >= 2:
        return key.rsplit("_", 2)[0]
    return _prompt_group(row.get("input"))


def _prompt_group(prompt: Any) -> str:
    import hashlib

    return hashlib.sha1(str(prompt).encode()).hexdigest()[:32]


def rollout_row_to_episode(row: dict[str, Any]) -> dict[str, Any]:
    """One line of verl's rollout dump (input, output, gts, score, step, and from our agent loop
    termination_reason, error, traceback) as an ``Episode.to_dict()``."""
    return _row_episode(row).to_dict()


def _row_episode(row: dict[str, Any]) -> Episode:
    """The episode of a row verl's own single-turn loop ran: one turn, with the tokens and verl's
    generation time where our job added them to the dump (``DUMP_COLUMNS``)."""
    score = float(row.get("score") or 0.0)
    prompt = [{"role": "user", "content": str(row["input"])}] if row.get("input") is not None else []
    prompt_ids = [int(t) for t in row.get(DUMP_PROMPT_IDS) or []]
    response_ids = [int(t) for t in row.get(DUMP_RESPONSE_IDS) or []]
    logprobs = [float(x) for x in row.get(DUMP_LOGPROBS) or []]
    seconds = row.get(DUMP_GENERATION_SECONDS)
    step = Step(chat_completions=prompt, model_response=str(row.get("output", "")), reward=score, done=True,
                info={} if seconds is None else {"generation_seconds": float(seconds)},
                prompt_ids=prompt_ids, response_ids=response_ids, logprobs=logprobs)
    reason = row.get("termination_reason")
    task = {"prompt": row.get("input"), "ground_truth": row.get("gts")}
    if row.get(DUMP_DATA_SOURCE):
        task["data_source"] = str(row[DUMP_DATA_SOURCE])
    episode = Episode(
        task=task, prompt_ids=prompt_ids, response_ids=response_ids,
        response_mask=[int(m) for m in row.get(DUMP_RESPONSE_MASK) or []], response_logprobs=logprobs,
        trajectories=[Trajectory(steps=[step], reward=score)],
        is_correct=bool(row.get("acc", score >= 1.0)),
        termination_reason=TerminationReason(reason) if reason else None,
        error=row.get("error") or None,
        info={"traceback": row["traceback"]} if row.get("traceback") else {},
    )
    return episode


# -- running verl on Ray ---------------------------------------------------------------------


class _OnDriverNode:
    """Stands in for verl's TaskRunner actor class in ``run_ppo``: the same actor, pinned to this
    machine so that the metrics file it writes is the one the bridge reads, with our env vars.
    ``run_ppo`` calls ``remote()`` (or ``options(...).remote()``) once Ray is up."""

    def __init__(self, actor_cls: Any, env_vars: dict[str, str], options: dict[str, Any] | None = None) -> None:
        self.actor_cls = actor_cls
        self.env_vars = env_vars
        self.extra = dict(options or {})
        self.handle: Any = None

    def options(self, **options: Any) -> "_OnDriverNode":
        return _OnDriverNode(self.actor_cls, self.env_vars, {**self.extra, **options})

    def remote(self) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        extra = dict(self.extra)
        runtime_env = dict(extra.pop("runtime_env", None) or {})
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **self.env_vars}
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        self.handle = self.actor_cls.options(scheduling_strategy=here, runtime_env=runtime_env, **extra).remote()
        return self.handle


class VerlProcessor(BuiltinProcessor):
    """Train with verl's PPO trainer (FSDP + vLLM/SGLang) on Ray.

    ``check_config`` accepts our keys and, besides them, any key of verl's PPO trainer config
    (e.g. ``actor_rollout_ref.actor.fsdp_config.param_offload=true``); it writes the final verl
    config to ``verl_config.yaml`` next to ``config.yaml``.
    """

    name = "verl"
    tools_in_process = False  # the agent loop runs in Ray workers

    def __init__(self, run_path: str) -> None:
        super().__init__(run_path)
        self.verl_overrides: dict[str, Any] = {}
        self.verl_config: Any = None

    @classmethod
    def environment_status(cls, config: Any = None) -> dict[str, str | None]:
        if not is_verl_available():
            return {"environment": "verl is not installed", "credentials": None}
        return {"environment": None if cuda_device_count() else "no CUDA GPU on this machine", "credentials": None}

    def default_overrides(self) -> dict[str, Any]:
        return {"actor_rollout_ref.model.dtype": "bfloat16"}

    def check_config(self, config: ConfigInput = None) -> Config:
        ours, self.verl_overrides = split_overrides(config)
        final = super().check_config(ours)  # our validation, then check_backend (GPUs), config.yaml
        if final.actor_rollout_ref.model.path is None:
            raise ConfigError("actor_rollout_ref.model.path", "the verl backend needs a model: a hub id or a local directory.")
        self.verl_config = self.compose(final)
        self.write_verl_config()
        return final

    def check_backend(self, config: Config) -> None:
        from training.algorithms.episode_rows import refuse_row_options  # brings in torch: imported on first use

        refuse_row_options(config, f"the {self.name} backend trains one sequence per episode; use backend=trl")
        self._refuse_declared_multi_trajectory_workflow()
        if not is_verl_available():
            raise ValueError("the verl backend needs verl: pip install 'verl[vllm]' (or choose trl).")
        gpus = cuda_device_count()
        if gpus == 0:
            raise ValueError(NO_GPU_MESSAGE)
        if config.trainer.ray_address is None and config.trainer.nnodes == 1 and config.trainer.n_gpus_per_node > gpus:
            raise ConfigError(
                "trainer.n_gpus_per_node",
                f"asks for {config.trainer.n_gpus_per_node} GPUs but this machine has {gpus}; "
                f"lower it or set trainer.ray_address to join a Ray cluster.",
            )

    def _refuse_declared_multi_trajectory_workflow(self) -> None:
        """verl's agent loop returns one sample per episode: a workflow class that declares several
        trajectories per episode is refused now, not at its first episode on the GPUs (a class that
        declares nothing is checked there, ``training.algorithms.episode_rows.single_sequence``)."""
        spec = self.agent_spec
        if spec is None or spec.kind != "workflow":
            return
        count = getattr(spec.workflow_class, "trajectories_per_episode", None)
        if count is not None and count > 1:
            raise ValueError(
                f"backend {self.name}: {spec.label} returns {count} trajectories per episode (its "
                f"trajectories_per_episode), but the {self.name} backend trains exactly one sequence per episode, "
                f"so all but the first would be dropped. Use backend=trl, tinker or fireworks, which train every "
                f"trajectory."
            )

    def compose(self, config: Config):
        """Write the datasets as parquet and compose verl's config for this run."""
        kind = self.agent_spec.kind
        loop = SINGLE_TURN_LOOP_NAME if kind == "single_turn" else AGENT_LOOP_NAME
        data_dir = self.path / "verl_data"
        keys = {"agent_name": loop, "prompt_key": config.data.prompt_key, "answer_key": config.data.answer_key}
        train_files = write_verl_parquet(dataset_to_tasks(self.train_dataset), data_dir / "train.parquet", split="train", **keys)
        val_files = None
        if self.test_dataset is not None:
            val_files = write_verl_parquet(dataset_to_tasks(self.test_dataset), data_dir / "test.parquet", split="test", **keys)
        reward_kwargs = None
        if self.reward_fn is not None:
            reward_kwargs = reward_kwargs_for(self.reward_spec if isinstance(self.reward_spec, str) else self.reward_fn, config.data.answer_key)
        payload = None
        if kind != "single_turn":
            payload = encode_object({"spec": self.agent_spec, "reward_fn": self.reward_fn, "config": config})
        if config.actor_rollout_ref.model.path == "tiny-char":
            from training.rollouts.tiny import save_tiny_model  # brings in torch: imported on first use

            model = config.actor_rollout_ref.model
            save_tiny_model(self.path / "tiny_model", layers=model.tiny_layers, hidden_size=model.tiny_hidden_size)
        verl = compose_verl_config(
            config,
            self.verl_overrides,
            run_path=self.path.resolve(),
            train_files=str(train_files.resolve()),
            val_files=str(val_files.resolve()) if val_files else None,
            agent_kind=kind,
            agent_payload=payload,
            reward_kwargs=reward_kwargs,
        )
        if self.attempt is not None:
            # verl saves (and rotates) in the attempt's own folder; its checkpoints are published into
            # the run's (VerlCheckpointPublisher), and a resumed attempt starts from those (runtime_config).
            # What verl's job writes besides (its metrics file, its rollout dumps) is the attempt's too.
            _set_verl_key(verl, "trainer.default_local_dir", str(self.attempt_checkpoint_dir().resolve()))
            # Two, not one: verl's checkpoint manager removes the previous actor once the next one is
            # saved but before the marker moves to it, so with one the publisher could take a marked
            # checkpoint whose actor was gone. With two, the marked one outlives the marker's move.
            _set_verl_key(verl, "trainer.max_actor_ckpt_to_keep", 2)
            _set_verl_key(verl, "trainer.rollout_data_dir", str(self.attempt_dir().resolve() / "verl_rollouts"))
            _set_verl_key(verl, "trainer.validation_data_dir", str(self.attempt_dir().resolve() / "verl_validation"))
        return verl

    def write_verl_config(self) -> Path:
        from omegaconf import OmegaConf

        target = self.attempt_dir() / "verl_config.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(OmegaConf.to_yaml(self.verl_config))
        self.publish_run_files(("verl_config.yaml",))
        return self.path / "verl_config.yaml"

    def train(self) -> TrainResult:
        from omegaconf import OmegaConf

        from verl.trainer.main_ppo import run_ppo

        # verl's TaskRunner, its dumps with the tokens verl trained on (brings in verl and Ray: imported where verl trains)
        from training.backends.verl.dumps import task_runner

        runner_cls = task_runner(bool(self.verl_config.trainer.use_v1))

        def launch(runner: _OnDriverNode) -> None:
            run_ppo(self.runtime_config(), task_runner_class=runner)

        def end_job(runner: _OnDriverNode) -> None:
            import ray

            ray.kill(runner.handle)

        return self.train_with(runner_cls, launch, end_job)

    def runtime_config(self) -> Any:
        """The config verl trains with: this run's, resuming from the run's newest published
        checkpoint (an earlier attempt's, never one a superseded attempt saved) when it has one."""
        from omegaconf import OmegaConf

        verl = OmegaConf.create(OmegaConf.to_container(self.verl_config))
        latest = latest_checkpoint(self.checkpoint_dir())
        if self.attempt is not None and verl.trainer.resume_mode == "auto" and latest:
            verl.trainer.resume_mode = "resume_path"
            verl.trainer.resume_from_path = latest
            logger.info("resuming from checkpoint %s", latest)
        return verl

    def train_with(self, runner_cls: Any, launch: Callable[[Any], None], end_job: Callable[[Any], None]) -> TrainResult:
        """Train with ``launch(runner)`` (verl's ``run_ppo`` with our TaskRunner stand-in), while the
        metrics bridge forwards what verl's Tracking writes (asking ``check_may_write`` first) and the
        publisher publishes each checkpoint it saves; ``end_job(runner)`` ends verl's job when the
        run must stop (a stop request, a failure, or this process no longer owning the run)."""
        verl = self.verl_config
        metrics_path = self.attempt_dir() / "verl_metrics.jsonl"
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
        metrics_path.unlink(missing_ok=True)
        env = {**_runner_env_vars(metrics_path), **verl_tracking_environment(self.config, self.path)}
        runner = _OnDriverNode(runner_cls, env)
        stopped = threading.Event()
        publisher = VerlCheckpointPublisher(self, verl.trainer.default_local_dir, forwarded=lambda: bridge.last_step)

        def honour_stop() -> None:
            failed = bridge.failure is not None
            if (failed or self.should_stop()) and not stopped.is_set() and runner.handle is not None:
                stopped.set()
                logger.info("%s: ending the verl job (checkpoints so far are kept)", "the run failed" if failed else "stop requested")
                end_job(runner)

        def after_poll() -> None:
            try:
                publisher.poll()
            finally:
                honour_stop()

        self.attach_default_sinks(trackers_elsewhere=VERL_TRACKERS)
        outcomes = OutcomeMonitor(self.config.trainer.max_episode_error_rate)
        trainer_config = self.config.trainer

        def keep_episodes(step: int, records: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
            return keep_for_store(records, trainer_config.log_episodes_fraction, trainer_config.log_episodes_per_step,
                                  trainer_config.seed + step * 2 + (split == VALIDATION))

        stores = trainer_config.log_episodes and self.sinks.stores_episodes
        bridge = VerlMetricsBridge(
            self.sinks, metrics_path, verl.trainer.rollout_data_dir, on_poll=after_poll, outcomes=outcomes,
            may_forward=self.check_may_write, keep_episodes=keep_episodes if stores else None,
            rows_per_step=self.config.data.train_batch_size * self.config.actor_rollout_ref.rollout.n,
            validation_dir=verl.trainer.validation_data_dir, val_rows_per_step=_validation_rows(verl),
            algorithm=verl.algorithm,
        )
        with self.sinks:  # closed once the run is judged, so a sink that records the outcome has it
            bridge.start()
            try:
                launch(runner)
            except Exception:
                if not stopped.is_set():
                    raise
            finally:
                bridge.stop()
            publisher.poll()  # the last step's checkpoint
            if bridge.failure is not None:
                raise bridge.failure
            outcomes.check_finished(bridge.last_step, stopped.is_set())
        return TrainResult(
            run_path=self.run_path,
            steps=bridge.last_step,
            metrics=bridge.last_metrics,
            checkpoint=latest_checkpoint(self.checkpoint_dir()),
            stopped=stopped.is_set(),
        )


def _validation_rows(verl: Any) -> int | None:
    """How many rows verl's validation dumps: its validation file's rows, ``val_kwargs.n`` each."""
    import pyarrow.parquet as pq  # a dependency of datasets; imported where the file is read

    try:
        return pq.ParquetFile(str(verl.data.val_files)).metadata.num_rows * int(verl.actor_rollout_ref.rollout.val_kwargs.n)
    except (OSError, ValueError):
        return None


def _runner_env_vars(metrics_path: Path) -> dict[str, str]:
    """Environment of verl's TaskRunner, inherited by every worker it starts: where Tracking's
    file backend writes, and a PYTHONPATH that finds this library and the user's modules
    (pickled classes are imported by name on the workers)."""
    library_root = str(Path(__file__).resolve().parents[3])
    paths = [library_root, os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        "VERL_FILE_LOGGER_PATH": str(metrics_path.resolve()),
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
    }


def marked_step(directory: str | Path) -> int | None:
    """The step verl's marker file (``latest_checkpointed_iteration.txt``) in ``directory`` names."""
    try:
        return int((Path(directory) / VERL_LATEST).read_text().strip())
    except (OSError, ValueError):
        return None


def latest_checkpoint(directory: str | Path) -> str | None:
    """verl's newest ``global_step_N`` directory, as named by its ``latest_checkpointed_iteration.txt``."""
    step = marked_step(directory)
    path = Path(directory) / f"global_step_{step}"
    return str(path) if step is not None and path.is_dir() else None
