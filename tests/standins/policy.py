"""The compute behind the stand-in training services: a real tiny torch model (``training.rollouts.tiny``).

It samples with per-token log-probabilities, computes Tinker's RL losses (``importance_sampling``
and ``ppo``) with a real backward pass, steps AdamW with the parameters each ``optim_step`` sends,
and keeps named weight snapshots (sampler weights, training state with optimizer). The HTTP
layers (``tinker_service``, ``fireworks_service``) only translate wire formats to these calls.

What this does not copy from the real services: LoRA (the whole tiny model is trained; the rank is
recorded and reported, not applied), batching across requests, and any GPU placement.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field

import torch

from training.rollouts.generation import HFBatchGenerator
from training.rollouts.tiny import build_char_tokenizer, build_tiny_model

TINY_BASE_MODEL = "tiny-char"


@dataclass
class Snapshot:
    weights: dict[str, torch.Tensor]
    optimizer: dict | None = None


@dataclass
class TinyPolicy:
    """One trainable model (one ``model_id``) of a stand-in service."""

    base_model: str
    lora_rank: int = 0
    seed: int = 0
    model: torch.nn.Module = field(init=False)
    optimizer: torch.optim.Optimizer | None = field(init=False, default=None)
    optimizer_steps: int = field(init=False, default=0)
    lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.base_model != TINY_BASE_MODEL:
            raise ValueError(f"base model {self.base_model!r} is not served here (only {TINY_BASE_MODEL!r})")
        self.tokenizer = build_char_tokenizer()
        self.model = build_tiny_model(self.tokenizer, seed=self.seed)
        self.model.train()

    # -- weights -------------------------------------------------------------------------
    def snapshot(self, with_optimizer: bool) -> Snapshot:
        with self.lock:
            weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            state = copy.deepcopy(self.optimizer.state_dict()) if (with_optimizer and self.optimizer) else None
        return Snapshot(weights, state)

    def restore(self, snapshot: Snapshot) -> None:
        with self.lock:
            self.model.load_state_dict(snapshot.weights)
            self.optimizer = None
            if snapshot.optimizer is not None:
                self.optimizer = self._new_optimizer()
                self.optimizer.load_state_dict(snapshot.optimizer)

    # -- training ------------------------------------------------------------------------
    def forward_backward(self, datums: list[dict], loss_fn: str, config: dict[str, float]) -> tuple[list[list[float]], float]:
        """Accumulate gradients of the summed loss; returns each datum's target log-probabilities."""
        if loss_fn not in ("importance_sampling", "ppo", "cross_entropy"):
            raise ValueError(f"loss_fn {loss_fn!r} is not implemented by this stand-in")
        low, high = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
        outputs, total = [], 0.0
        with self.lock:
            for datum in datums:
                ids = torch.tensor([datum["input"]])
                targets = torch.tensor(datum["target_tokens"])
                logits = self.model(input_ids=ids).logits[0].float()
                logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
                if loss_fn == "cross_entropy":
                    loss = -(logprobs * torch.tensor(datum.get("weights", [1.0] * len(targets)))).sum()
                else:
                    advantages = torch.tensor(datum["advantages"], dtype=torch.float32)
                    ratio = torch.exp(logprobs - torch.tensor(datum["logprobs"], dtype=torch.float32))
                    if loss_fn == "ppo":
                        objective = torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)
                    else:
                        objective = ratio * advantages
                    loss = -objective.sum()
                loss.backward()
                total += float(loss.detach())
                outputs.append(logprobs.detach().tolist())
        return outputs, total

    def optim_step(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, grad_clip: float) -> dict[str, float]:
        with self.lock:
            if self.optimizer is None:
                self.optimizer = self._new_optimizer()
            for group in self.optimizer.param_groups:
                group.update(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
            norm = 0.0
            if grad_clip > 0:
                norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), grad_clip))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.optimizer_steps += 1
        return {"grad_norm:mean": norm}

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=1e-4)


class SamplerPool:
    """Sampling from named weight snapshots (one eval-mode model, reloaded when the snapshot changes)."""

    def __init__(self) -> None:
        self.tokenizer = build_char_tokenizer()
        self.model = build_tiny_model(self.tokenizer, seed=0)
        self.model.eval()
        self.loaded: str | None = None
        self.lock = threading.Lock()
        self.requests = 0

    def sample(
        self, snapshot_name: str, weights: dict[str, torch.Tensor], prompt: list[int], max_tokens: int,
        temperature: float, top_p: float, seed: int | None,
    ) -> tuple[list[int], list[float], bool]:
        with self.lock:
            self.requests += 1
            if self.loaded != snapshot_name:
                self.model.load_state_dict(weights)
                self.loaded = snapshot_name
            # temperature 0 (a warm-up probe) is greedy decoding; our sampler needs it positive.
            generator = HFBatchGenerator(self.model, self.tokenizer, temperature=max(temperature, 1e-5), top_p=top_p, seed=seed)
            output = generator.generate_batch([prompt], [max_tokens])[0]
        return output.completion_ids, output.logprobs, output.finish_reason == "stop"
