"""rLLM's ``AgentSFTTrainer``: supervised fine-tuning on conversations, with rLLM's config keys.

The data are rLLM's SFT rows: a ``messages`` list of ``{role, content}`` per row (what
``AgentSFTTrainer.process_trajectories`` makes of successful trajectories, or any chat dataset).
Each conversation is tokenized as rLLM does it (``data.rllm.tokenize_and_mask_method``):
``cumulative`` trains on every assistant message, ``stepwise`` on the last one only; the other
messages are context. Training runs on TRL's ``SFTTrainer`` (backend ``trl``, the default) with
the tokens and loss masks made here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.rendering import encode, render_messages
from training.log import logger
from training.rollouts.models import TINY_MODEL

# Keys of rLLM's SFT launch scripts (examples/sft/train_math_sft.sh, examples/sft_tinker/*.sh) and
# configs (verl's sft_trainer.yaml, rLLM's tinker_sft_trainer.yaml) accepted and logged as unused:
# where or how the job runs or is logged, never what is learnt; and data.renderer_name, because
# conversations are rendered with the tokenizer's own chat template here.
NO_EFFECT = frozenset({
    "trainer.logger", "trainer.project_name", "trainer.experiment_name", "trainer.nnodes",
    "trainer.n_gpus_per_node", "trainer.log_episodes", "trainer.episode_log_dir", "trainer.default_hdfs_dir",
    "ulysses_sequence_parallel_size", "use_remove_padding", "model.fsdp_config", "model.external_lib",
    "model.use_liger", "data.multiturn.enable", "data.balance_dp_token", "data.custom_cls", "data.renderer_name",
})


@dataclass(frozen=True)
class SFTSettings:
    """What ``AgentSFTTrainer`` reads from rLLM's config (its key in brackets)."""

    model: str  # [model.partial_pretrain, or model.name in rLLM's tinker config] a hub id, a directory or "tiny-char"
    trust_remote_code: bool = False  # [model.trust_remote_code]
    lora_rank: int = 0  # [model.lora_rank] 0 trains every weight; > 0 trains LoRA adapters of this rank
    lora_alpha: int = 16  # [model.lora_alpha]
    target_modules: Any = "all-linear"  # [model.target_modules] the LoRA targets (peft's names)
    gradient_checkpointing: bool = False  # [model.enable_gradient_checkpointing]
    train_files: Any = None  # [data.train_files] parquet/jsonl path(s); used when no train_dataset is given
    val_files: Any = None  # [data.val_files]
    messages_key: str = "messages"  # [data.multiturn.messages_key]
    train_batch_size: int = 4  # [data.train_batch_size] conversations per optimizer step
    micro_batch_size: int | None = None  # [data.micro_batch_size_per_gpu] per forward pass (default: train_batch_size)
    max_length: int = 1024  # [data.max_length] tokens per conversation
    truncation: str = "error"  # [data.truncation] right (keep the start), left (keep the end) or error
    tokenize_and_mask_method: str = "cumulative"  # [data.rllm.tokenize_and_mask_method] or stepwise
    lr: float = 1e-5  # [optim.lr]
    lr_scheduler: str = "constant"  # [optim.lr_scheduler] constant, linear or cosine
    warmup_steps_ratio: float = 0.0  # [optim.warmup_steps_ratio]
    betas: tuple[float, float] = (0.9, 0.95)  # [optim.betas]
    eps: float = 1e-8  # [optim.eps]
    weight_decay: float = 0.0  # [optim.weight_decay]
    clip_grad: float = 1.0  # [optim.clip_grad]
    total_epochs: int = 1  # [trainer.total_epochs]
    total_training_steps: int | None = None  # [trainer.total_training_steps] stops earlier when set
    default_local_dir: str = "checkpoints/sft"  # [trainer.default_local_dir] checkpoints and the final model
    save_freq: int = -1  # [trainer.save_freq] steps between checkpoints (-1: only the final model)
    test_freq: int = -1  # [trainer.test_freq] steps between validation losses (-1: none)
    seed: int = 1  # [trainer.seed]
    device: str = "auto"  # [trainer.device] cpu, or auto (a GPU when there is one)
    tinker_base_url: str | None = None  # [tinker_base_url] the Tinker service (None: Tinker's own)
    unused: tuple[str, ...] = field(default=())  # the NO_EFFECT keys the config set

    def __post_init__(self) -> None:
        problems = []
        if not self.model:
            problems.append("model.partial_pretrain: no model given; name a hub id, a local directory or 'tiny-char'")
        if self.tokenize_and_mask_method not in ("cumulative", "stepwise"):
            problems.append(f"data.rllm.tokenize_and_mask_method: {self.tokenize_and_mask_method!r} is not cumulative or stepwise")
        if self.truncation not in ("right", "left", "error"):
            problems.append(f"data.truncation: {self.truncation!r} is not right, left or error")
        if self.lr_scheduler not in ("constant", "linear", "cosine"):
            problems.append(f"optim.lr_scheduler: {self.lr_scheduler!r} is not constant, linear or cosine")
        micro = self.micro_batch_size or self.train_batch_size
        if self.train_batch_size < 1 or micro < 1 or self.train_batch_size % micro:
            problems.append(f"data.train_batch_size ({self.train_batch_size}) must be a positive multiple of "
                            f"data.micro_batch_size_per_gpu ({micro})")
        if self.max_length < 2:
            problems.append(f"data.max_length: {self.max_length} leaves nothing to train on; give at least 2")
        if self.lr <= 0 or self.total_epochs < 1:
            problems.append(f"optim.lr ({self.lr}) and trainer.total_epochs ({self.total_epochs}) must be positive")
        if self.device not in ("auto", "cpu", "cuda"):
            problems.append(f"trainer.device: {self.device!r} is not auto, cpu or cuda")
        if problems:
            raise ValueError("AgentSFTTrainer config: " + "; ".join(problems) + ".")

    @classmethod
    def from_config(cls, config: Any) -> "SFTSettings":
        """From rLLM's config: an OmegaConf/Hydra config, a nested dict, or ``key=value`` overrides
        (a launch script's lines). A key this trainer does not know is refused by name."""
        flat = _flatten(_as_container(config))
        values: dict[str, Any] = {}
        unused = []
        for key, value in flat.items():
            key = key.lstrip("+")
            if key in _KEYS:
                values[_KEYS[key]] = value
            elif any(key == k or key.startswith(k + ".") for k in NO_EFFECT):
                unused.append(key)
            elif key.startswith("hydra."):
                continue
            elif key in ALL_LAYERS:
                if value is not True:
                    raise ValueError(f"AgentSFTTrainer config: {key}={value} is not implemented: LoRA covers every layer "
                                     "here (rLLM's default, true); remove it.")
            else:
                raise ValueError(
                    f"AgentSFTTrainer config: {key} is not a key this trainer knows; its keys are "
                    f"{', '.join(sorted(_KEYS))} (and, without effect here, {', '.join(sorted(NO_EFFECT))})."
                )
        if "betas" in values:
            values["betas"] = tuple(float(b) for b in values["betas"])
        if unused:
            logger.info("AgentSFTTrainer: these keys do not change what is learnt and are not used: %s", ", ".join(unused))
        return cls(**values, unused=tuple(unused))


_KEYS = {
    "model.partial_pretrain": "model", "model.name": "model", "model.trust_remote_code": "trust_remote_code",
    "model.lora_rank": "lora_rank", "model.lora_alpha": "lora_alpha", "model.target_modules": "target_modules",
    "model.enable_gradient_checkpointing": "gradient_checkpointing",
    "data.train_files": "train_files", "data.val_files": "val_files", "data.multiturn.messages_key": "messages_key",
    "data.train_batch_size": "train_batch_size", "data.micro_batch_size_per_gpu": "micro_batch_size",
    "data.micro_batch_size": "micro_batch_size", "data.max_length": "max_length", "data.truncation": "truncation",
    "data.rllm.tokenize_and_mask_method": "tokenize_and_mask_method",
    "optim.lr": "lr", "optim.lr_scheduler": "lr_scheduler", "optim.warmup_steps_ratio": "warmup_steps_ratio",
    "optim.betas": "betas", "optim.eps": "eps", "optim.weight_decay": "weight_decay", "optim.clip_grad": "clip_grad",
    "trainer.total_epochs": "total_epochs", "trainer.total_training_steps": "total_training_steps",
    "trainer.default_local_dir": "default_local_dir", "trainer.save_freq": "save_freq", "trainer.test_freq": "test_freq",
    "trainer.seed": "seed", "trainer.device": "device", "tinker_base_url": "tinker_base_url",
}
# rLLM's tinker switches of which layers LoRA covers: all of them here (their default, true); false is refused.
ALL_LAYERS = ("model.train_unembed", "model.train_attn", "model.train_mlp")


@dataclass
class SFTResult:
    """What ``AgentSFTTrainer.train()`` returns: where the trained model was saved and the training losses."""

    model_dir: Path | str  # a directory (trl), or the service's weights path (tinker://...)
    losses: list[float]
    steps: int


class AgentSFTTrainer:
    """rLLM's ``rllm.trainer.agent_sft_trainer.AgentSFTTrainer(config, train_dataset, val_dataset, backend)``.

    ``train_dataset`` / ``val_dataset``: rows with a messages list (a ``DatasetRegistry`` dataset,
    a ``datasets.Dataset``, a list of dicts or a file path); without them, ``data.train_files`` /
    ``data.val_files``. ``backend``: ``trl`` (default) trains with TRL's ``SFTTrainer``; ``tinker``
    trains LoRA weights on the Tinker service through its SDK (``TINKER_API_KEY``, ``tinker_base_url``),
    rLLM's loop: a ``cross_entropy`` ``forward_backward`` and an Adam ``optim_step`` per batch of
    ``data.train_batch_size`` conversations, the learning rate following ``optim.lr_scheduler``.
    rLLM's ``verl`` backend (its default, FSDP on GPUs) is refused by name. Every row is
    checked before training starts; a bad one is refused naming its index and what is wrong.
    """

    def __init__(self, config: Any, train_dataset: Any = None, val_dataset: Any = None, backend: str = "trl") -> None:
        if backend not in ("trl", "tinker"):
            raise ValueError(
                f"AgentSFTTrainer(backend={backend!r}): supervised fine-tuning runs on the trl backend (TRL's "
                "SFTTrainer) or the tinker backend here; rLLM's verl SFT backend (FSDP on GPUs) is not implemented. "
                "Use backend='trl'."
            )
        self.backend = backend
        self.settings = config if isinstance(config, SFTSettings) else SFTSettings.from_config(config)
        self.train_dataset = train_dataset
        self.val_dataset = val_dataset
        self._tokenizer: Any = None

    def train(self) -> SFTResult:
        if self.backend == "tinker":
            return self._train_tinker()
        import torch
        import trl
        from transformers import AutoModelForCausalLM, AutoTokenizer

        s = self.settings
        model_path = self._model_path()
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=s.trust_remote_code)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self._tokenizer = tokenizer
        train = self._tokenized(self.train_dataset, s.train_files, "train_dataset", tokenizer)
        if train is None:
            raise ValueError("AgentSFTTrainer: no training data; pass train_dataset or set data.train_files.")
        val = self._tokenized(self.val_dataset, s.val_files, "val_dataset", tokenizer)
        model = AutoModelForCausalLM.from_pretrained(model_path, trust_remote_code=s.trust_remote_code)
        micro = s.micro_batch_size or s.train_batch_size
        use_cpu = s.device == "cpu" or not torch.cuda.is_available()
        output = Path(s.default_local_dir)
        evaluate = val is not None and s.test_freq > 0
        args = trl.SFTConfig(
            output_dir=str(output),
            per_device_train_batch_size=micro,
            per_device_eval_batch_size=micro,
            gradient_accumulation_steps=s.train_batch_size // micro,
            num_train_epochs=s.total_epochs,
            max_steps=s.total_training_steps or -1,
            learning_rate=s.lr,
            lr_scheduler_type=s.lr_scheduler,
            warmup_steps=s.warmup_steps_ratio,  # a float below 1 is a share of the steps
            adam_beta1=s.betas[0],
            adam_beta2=s.betas[1],
            adam_epsilon=s.eps,
            weight_decay=s.weight_decay,
            max_grad_norm=s.clip_grad,
            max_length=None,  # cut here, as data.truncation says
            gradient_checkpointing=s.gradient_checkpointing,
            save_strategy="steps" if s.save_freq > 0 else "no",
            save_steps=s.save_freq if s.save_freq > 0 else 500,
            eval_strategy="steps" if evaluate else "no",
            eval_steps=s.test_freq if evaluate else None,
            logging_steps=1,
            report_to="none",
            use_cpu=use_cpu,
            seed=s.seed,
            data_seed=s.seed,
        )
        peft_config = None
        if s.lora_rank > 0:
            from peft import LoraConfig

            peft_config = LoraConfig(r=s.lora_rank, lora_alpha=s.lora_alpha, target_modules=s.target_modules, task_type="CAUSAL_LM")
        trainer = trl.SFTTrainer(
            model=model, args=args, train_dataset=train, eval_dataset=val if evaluate else None,
            processing_class=tokenizer, peft_config=peft_config,
        )
        trainer.train()
        final = output / "final_model"
        # LoRA adapters are merged into the weights, so the result loads (and serves) like any model.
        trained = trainer.model.merge_and_unload() if peft_config is not None else trainer.model
        trained.save_pretrained(str(final))
        tokenizer.save_pretrained(str(final))
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        logger.info("SFT done: %d steps, loss %s -> %s; model in %s", trainer.state.global_step,
                    f"{losses[0]:.4g}" if losses else "-", f"{losses[-1]:.4g}" if losses else "-", final)
        return SFTResult(model_dir=final, losses=losses, steps=trainer.state.global_step)

    def tokenize(self, messages: list[dict], tokenizer: Any = None) -> tuple[list[int], list[int]]:
        """One conversation as ``(input_ids, loss_mask)`` by ``data.rllm.tokenize_and_mask_method``:
        each message's tokens are what it adds to the chat-template rendering of the conversation
        (a model without a chat template reads the contents one after the other, each assistant
        message followed by EOS so that the model learns to stop); 1 on the trained assistant
        messages, 0 elsewhere."""
        tokenizer = tokenizer or self._tokenizer
        last_assistant = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        templated = bool(getattr(tokenizer, "chat_template", None))
        ids: list[int] = []
        mask: list[int] = []
        before = ""
        for index, message in enumerate(messages):
            text = render_messages(tokenizer, messages[: index + 1], add_generation_prompt=False)
            added = text[len(before):] if text.startswith(before) else render_messages(tokenizer, [message], add_generation_prompt=False)
            before = text
            piece = encode(tokenizer, added)
            if message["role"] == "assistant" and not templated:
                piece.append(tokenizer.eos_token_id)
            trained = message["role"] == "assistant" and (
                self.settings.tokenize_and_mask_method == "cumulative" or index == last_assistant
            )
            ids += piece
            mask += [int(trained)] * len(piece)
        return ids, mask

    @staticmethod
    def process_trajectories(trajectories: list[Any], reward_threshold: float, filter_tool_calls: bool = False) -> list[dict]:
        """rLLM's: the conversations (last step's ``chat_completions``) of trajectories whose reward
        is at least ``reward_threshold``, as ``{"messages": [...]}`` rows of SFT data; messages
        without a role or with empty content are dropped, and rows with fewer than two messages.
        ``filter_tool_calls=True`` (rLLM's generate_sft_data.py passes it; its trainer has no such
        argument) keeps only conversations in which the assistant called a tool."""
        rows = []
        for trajectory in trajectories:
            if not trajectory or trajectory.reward < reward_threshold or not trajectory.steps:
                continue
            messages = getattr(trajectory.steps[-1], "chat_completions", None) or []
            if filter_tool_calls and not any(
                m.get("role") == "assistant" and (m.get("tool_calls") or "<tool_call>" in str(m.get("content", "")))
                for m in messages if isinstance(m, dict)
            ):
                continue
            clean = [{"role": m["role"], "content": str(m["content"]).strip()} for m in messages
                     if isinstance(m, dict) and m.get("role") and str(m.get("content", "")).strip()]
            if len(clean) >= 2:
                rows.append({"messages": clean})
        print(f"Processed {len(trajectories)} trajectories -> {len(rows)} valid examples")
        return rows

    # -- tinker --------------------------------------------------------------------------------

    def _train_tinker(self) -> SFTResult:
        import os
        import random

        import tinker
        from tinker import types

        s = self.settings
        api_key = os.environ.get("TINKER_API_KEY")
        if not api_key:
            raise ValueError("AgentSFTTrainer(backend='tinker'): TINKER_API_KEY is not set; export your Tinker API key.")
        tokenizer = self._tinker_tokenizer()
        self._tokenizer = tokenizer
        train = self._tokenized(self.train_dataset, s.train_files, "train_dataset", tokenizer)
        if train is None:
            raise ValueError("AgentSFTTrainer: no training data; pass train_dataset or set data.train_files.")
        rows = list(zip(train["input_ids"], train["assistant_masks"]))
        per_epoch = len(rows) // s.train_batch_size  # as rLLM: a last partial batch is left out
        if per_epoch == 0:
            raise ValueError(f"AgentSFTTrainer: {len(rows)} training rows make no batch of data.train_batch_size={s.train_batch_size}.")
        total = per_epoch * s.total_epochs
        if s.total_training_steps:
            total = min(total, s.total_training_steps)
        if (self.val_dataset is not None or s.val_files) and s.test_freq > 0:
            logger.warning("AgentSFTTrainer(backend='tinker'): validation (trainer.test_freq) is not implemented on tinker; "
                           "the validation data are not scored.")
        service = tinker.ServiceClient(base_url=s.tinker_base_url, api_key=api_key)
        outcome = "errored"
        try:
            client = service.create_lora_training_client(base_model=s.model, rank=s.lora_rank or 32, seed=s.seed).result()
            order = list(range(len(rows)))
            losses: list[float] = []
            for step in range(total):
                if step % per_epoch == 0:  # a new epoch: a new order, as rLLM's set_epoch(seed=epoch)
                    random.Random(s.seed + step // per_epoch).shuffle(order)
                start = (step % per_epoch) * s.train_batch_size
                batch = [rows[i] for i in order[start : start + s.train_batch_size]]
                datums = [
                    types.Datum(
                        model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={
                            "target_tokens": types.TensorData(data=ids[1:], dtype="int64", shape=[len(ids) - 1]),
                            "weights": types.TensorData(data=[float(m) for m in mask[1:]], dtype="float32", shape=[len(ids) - 1]),
                        },
                    )
                    for ids, mask in batch
                ]
                adam = types.AdamParams(learning_rate=s.lr * _schedule(s.lr_scheduler, step, total, s.warmup_steps_ratio),
                                        beta1=s.betas[0], beta2=s.betas[1], eps=s.eps, weight_decay=s.weight_decay,
                                        grad_clip_norm=s.clip_grad)
                backward = client.forward_backward(datums, "cross_entropy")
                optim = client.optim_step(adam)  # queued behind forward_backward, as the SDK recommends
                output = backward.result()
                optim.result()
                losses.append(_mean_nll_of(output, batch))
                logger.info("SFT step %d/%d: train mean NLL %.4f", step + 1, total, losses[-1])
                if s.save_freq > 0 and (step + 1) % s.save_freq == 0:
                    logger.info("SFT checkpoint: %s", client.save_state(f"{step + 1:06d}").result().path)
            path = client.save_weights_for_sampler("final").result().path
            logger.info("SFT done on tinker: %d steps; weights at %s", total, path)
            outcome = "success"
        finally:
            try:  # ends the session and its heartbeat thread
                service.close(outcome).result(timeout=30)
            except Exception as exc:  # the session expires on its own once heartbeats stop
                logger.warning("closing the tinker session failed (it expires without heartbeats): %s", exc)

        return SFTResult(model_dir=path, losses=losses, steps=total)

    def _tinker_tokenizer(self) -> Any:
        """The base model's tokenizer, loaded here: conversations are tokenized locally."""
        from transformers import AutoTokenizer

        if self.settings.model == TINY_MODEL:
            from training.rollouts.tiny import build_char_tokenizer  # brings in torch: imported on first use

            return build_char_tokenizer()
        return AutoTokenizer.from_pretrained(self.settings.model, trust_remote_code=self.settings.trust_remote_code)

    # -- data ----------------------------------------------------------------------------------

    def _model_path(self) -> str:
        if self.settings.model != TINY_MODEL:
            return self.settings.model
        from training.rollouts.tiny import save_tiny_model  # brings in torch: imported on first use

        return str(save_tiny_model(Path(self.settings.default_local_dir) / "base_model", seed=self.settings.seed))

    def _tokenized(self, dataset: Any, files: Any, what: str, tokenizer: Any) -> Any:
        """The rows as TRL's pre-tokenized columns (``input_ids``, ``assistant_masks``), every row checked first."""
        import datasets

        from training.data import load_dataset  # brings in datasets: imported on first use

        source = dataset if dataset is not None else files
        if source is None:
            return None
        if isinstance(source, (list, tuple)) and source and all(isinstance(f, (str, Path)) for f in source):
            source = datasets.concatenate_datasets([load_dataset(str(f), what=what) for f in source])
        rows = load_dataset(source, what=what)
        key, s = self.settings.messages_key, self.settings
        columns = {"input_ids": [], "assistant_masks": []}
        for index, row in enumerate(rows):
            messages = row.get(key)
            where = f"{what} row {index}"
            if not isinstance(messages, list) or not messages:
                raise ValueError(f"{where}: no {key!r} list (data.multiturn.messages_key); its fields are {sorted(k for k, v in row.items() if v is not None)}.")
            for position, message in enumerate(messages):
                if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
                    raise ValueError(f"{where}: {key}[{position}] must be a {{role, content}} object with text content.")
            ids, mask = self.tokenize(messages, tokenizer)
            if len(ids) > s.max_length:
                if s.truncation == "error":
                    raise ValueError(f"{where}: {len(ids)} tokens, more than data.max_length={s.max_length} "
                                     "(set data.truncation=right or left to cut it).")
                ids, mask = (ids[: s.max_length], mask[: s.max_length]) if s.truncation == "right" else (ids[-s.max_length:], mask[-s.max_length:])
            if not any(mask):
                raise ValueError(f"{where}: no assistant tokens to train on (within data.max_length={s.max_length}).")
            columns["input_ids"].append(ids)
            columns["assistant_masks"].append(mask)
        return datasets.Dataset.from_dict(columns)


def mean_nll(model: Any, rows: list[tuple[list[int], list[int]]]) -> float:
    """The model's mean negative log-likelihood per trained token (mask 1) of ``(ids, mask)`` rows."""
    import torch

    total, count = 0.0, 0
    model.eval()
    with torch.inference_mode():
        for ids, mask in rows:
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
            logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
            weights = torch.tensor(mask[1:], dtype=torch.float)
            total += float(-(logprobs * weights).sum())
            count += int(weights.sum())
    return total / count if count else math.nan


def _schedule(name: str, step: int, total: int, warmup_ratio: float) -> float:
    """The learning-rate multiplier at ``step``: linear warmup, then constant, linear or cosine decay."""
    warmup = int(total * warmup_ratio)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    if name == "linear":
        return 1.0 - progress
    if name == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def _mean_nll_of(output: Any, batch: list[tuple[list[int], list[int]]]) -> float:
    """Mean negative log-likelihood per trained token, from a cross_entropy forward_backward's log-probabilities."""
    total, count = 0.0, 0
    for record, (_, mask) in zip(output.loss_fn_outputs, batch):
        logprobs = record["logprobs"]
        values = logprobs.tolist() if hasattr(logprobs, "tolist") else list(logprobs.data)
        total -= sum(lp for lp, m in zip(values, mask[1:]) if m)
        count += sum(mask[1:])
    return total / count if count else math.nan


def _as_container(config: Any) -> dict:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)
    if isinstance(config, (list, tuple)):
        return OmegaConf.to_container(OmegaConf.from_dotlist([str(o).lstrip("+") for o in config]), resolve=True)
    if isinstance(config, dict):
        return config
    raise TypeError(f"AgentSFTTrainer config: expected a DictConfig, a dict or key=value overrides, not {type(config).__name__}.")


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and name not in _KEYS:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat
