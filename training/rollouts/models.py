"""Loading the policy model and tokenizer: a hub id, a local directory, or the built-in tiny model."""

from __future__ import annotations

import json
from pathlib import Path

from training.config import Config, ModelConfig

TINY_MODEL = "tiny-char"


def resolve_model_path(config: Config, run_path: str | Path) -> str:
    """The directory or hub id to load. ``tiny-char`` is built in code and saved under the run
    directory first, so that it loads through the same ``from_pretrained`` code as any model."""
    model = config.actor_rollout_ref.model
    if model.path is None:
        raise ValueError(
            "actor_rollout_ref.model.path: no model given; set it to a hub id, a local directory, "
            f"or '{TINY_MODEL}' for the built-in tiny model."
        )
    if model.path == TINY_MODEL:
        from training.rollouts.tiny import save_tiny_model  # brings in torch: imported on first use

        target = Path(run_path) / "base_model"
        save_tiny_model(target, layers=model.tiny_layers, hidden_size=model.tiny_hidden_size, seed=config.trainer.seed)
        return str(target)
    return model.path


def load_policy(config: Config, run_path: str | Path):
    """Load ``(model, tokenizer, path)``. Hub ids need network access; local directories do not."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(config, run_path)
    model_cfg = config.actor_rollout_ref.model
    if is_adapter(path):  # a LoRA run's trained model (run:<id>): its base with the adapter merged in
        model, tokenizer = load_trained(path, dtype=model_cfg.dtype, trust_remote_code=model_cfg.trust_remote_code)
        # peft loads an adapter frozen and its merge keeps the weights so: this run trains them (or a new adapter).
        model.requires_grad_(True)
        # A new adapter trained on these merged weights names the adapter folder as its base, not the first base.
        model.config._name_or_path = str(Path(path).resolve())
        return model, tokenizer, path
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_cfg.tokenizer_path or path, trust_remote_code=model_cfg.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, model_cfg.dtype), trust_remote_code=model_cfg.trust_remote_code
        )
    except OSError as exc:
        raise ValueError(
            f"actor_rollout_ref.model.path: could not load {path!r} ({exc}). Give a local directory "
            f"holding a saved model, a reachable hub id, or '{TINY_MODEL}'."
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if Path(path).is_dir():  # an adapter saved from this model names its base by this path, wherever it is read
        model.config._name_or_path = str(Path(path).resolve())
    return model, tokenizer, path


# -- LoRA ------------------------------------------------------------------------------------------
ADAPTER_CONFIG = "adapter_config.json"


def lora_config(config: Config):
    """peft's ``LoraConfig`` for ``actor_rollout_ref.model.lora_*`` (verl's names), or None when
    ``lora_rank`` is 0 (every weight trains)."""
    model = config.actor_rollout_ref.model
    if model.lora_rank == 0:
        return None
    from peft import LoraConfig  # an optional heavy dependency, imported with the models

    return LoraConfig(
        r=model.lora_rank, lora_alpha=model.lora_alpha, target_modules=model.target_modules,
        exclude_modules=model.exclude_modules, lora_dropout=0.0, task_type="CAUSAL_LM",
    )


def lora_keys_set(config: Config) -> list[str]:
    """The LoRA keys other than ``lora_rank`` that ``config`` sets away from their defaults: what a
    backend that takes only a rank must refuse by name."""
    model, defaults = config.actor_rollout_ref.model, ModelConfig()
    return [
        f"actor_rollout_ref.model.{name}"
        for name in ("lora_alpha", "target_modules", "exclude_modules")
        if getattr(model, name) != getattr(defaults, name)
    ]


def is_adapter(folder: str | Path) -> bool:
    """Whether ``folder`` holds a peft adapter (a LoRA run's checkpoint or final model) rather than whole weights."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def is_saved_model(folder: str | Path) -> bool:
    """Whether ``folder`` holds a trained model: whole weights (config.json) or a LoRA adapter."""
    return (Path(folder) / "config.json").is_file() or is_adapter(folder)


def adapter_base(folder: str | Path) -> str:
    """The base model an adapter was trained on, as its adapter_config.json names it."""
    return json.loads((Path(folder) / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]


def load_trained(folder: str | Path, *, dtype: str | None = None, trust_remote_code: bool = False,
                 local_files_only: bool = False):
    """``(model, tokenizer)`` of a run's saved model: whole weights as they are, an adapter merged
    into its base model (peft's ``merge_and_unload``), so that either generates at the base's speed."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    options = {"trust_remote_code": trust_remote_code, "local_files_only": local_files_only}
    tokenizer = AutoTokenizer.from_pretrained(str(folder), **options)
    weights = {**options, **({"dtype": getattr(torch, dtype)} if dtype is not None else {})}
    if is_adapter(folder):
        from peft import PeftModel  # an optional heavy dependency, imported with the models

        base = adapter_base(folder)
        try:  # the base may itself be an adapter: a LoRA run that started from another one's trained model
            if is_adapter(base):
                model = load_trained(base, dtype=dtype, **options)[0]
            else:
                model = AutoModelForCausalLM.from_pretrained(base, **weights)
        except OSError as exc:
            raise ValueError(
                f"{folder} is a LoRA adapter of {base!r}, which could not be loaded here ({exc}); the base model "
                "must be where the run found it."
            ) from exc
        model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(str(folder), **weights)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
