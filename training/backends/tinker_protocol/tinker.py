"""The ``tinker`` backend: Thinking Machines' Tinker service, through its SDK (``tinker``).

The service holds the base model and a LoRA adapter; we hold the agent, the environment and the
reward. Sampling goes through the SDK's ``SamplingClient`` (as our rollout engine's token
generator), training through ``TrainingClient.forward_backward`` / ``optim_step``, and after every
step ``save_weights_for_sampler`` publishes the new weights and a new sampling client follows them.
The loop itself is shared with the fireworks backend (``training.backends.tinker_protocol.service``).

Tinker-only: nothing is provisioned (the service is shared), so ``close`` ends the session; the
checkpoints are ``tinker://`` paths, and a resumed run loads the state with its optimizer
(``create_training_client_from_state_with_optimizer``). A run lost with its machine leaves nothing
running: the session lives on the SDK's heartbeats (every 10 s) and the service ends it when they
stop; Tinker bills the tokens trained and sampled, which stop with the process. Only its saved
checkpoints stay on the service (stored, to resume from), so ``release_abandoned`` has nothing to do.
"""

from __future__ import annotations

from typing import Any

from training.backends.tinker_protocol.service import (
    CheckpointRecord,
    RemoteGenerator,
    RemoteProcessor,
    SampleResult,
    ServiceSession,
    remote_call,
)
from training.log import logger


class TinkerSession(ServiceSession):
    service = "tinker"

    def __init__(self, config: Any, resume: CheckpointRecord | None, api_key: str) -> None:
        super().__init__()
        import tinker
        from tinker import types

        self.types = types
        self.config = config
        model = config.actor_rollout_ref.model
        self.service_client = remote_call(
            "tinker", "connecting", lambda: tinker.ServiceClient(base_url=config.remote.base_url, api_key=api_key)
        )
        self.sampling_client: Any = None
        try:
            if resume is not None:
                self.training_client = remote_call(
                    "tinker", f"loading the checkpoint {resume.state_path}",
                    lambda: self.service_client.create_training_client_from_state_with_optimizer(resume.state_path).result(),
                )
            else:
                self.training_client = remote_call(
                    "tinker", f"creating a LoRA training client for {model.path}",
                    lambda: self.service_client.create_lora_training_client(
                        base_model=model.path, rank=model.lora_rank, seed=config.trainer.seed,
                        train_unembed=config.remote.lora_train_unembed, train_attn=config.remote.lora_train_attn,
                        train_mlp=config.remote.lora_train_mlp,
                    ).result(),
                )
        except BaseException:
            self.close("errored")
            raise
        self.remote_ids["tinker_model_id"] = str(self.training_client.model_id)

    def publish(self, name: str) -> str:
        path = self.training_client.save_weights_for_sampler(name).result().path
        self.sampling_client = self.training_client.create_sampling_client(path).result()
        return path

    def save_state(self, name: str) -> str:
        return self.training_client.save_state(name).result().path

    def generator(self, tokenizer: Any, temperature: float | None = None, top_p: float | None = None) -> RemoteGenerator:
        rollout = self.config.actor_rollout_ref.rollout
        temperature = rollout.temperature if temperature is None else temperature
        top_p = rollout.top_p if top_p is None else top_p
        client, types = self.sampling_client, self.types
        stop = sorted({tokenizer.eos_token_id} - {None})

        async def sample(prompt_ids: list[int], max_new_tokens: int) -> SampleResult:
            params = types.SamplingParams(
                max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop=stop,
            )
            try:
                response = await client.sample(prompt=types.ModelInput.from_ints(prompt_ids), num_samples=1, sampling_params=params)
            except Exception as exc:
                raise RuntimeError(f"tinker sampling failed: {type(exc).__name__}: {exc}") from exc
            sequence = response.sequences[0]
            return SampleResult(
                completion_ids=[int(t) for t in sequence.tokens],
                logprobs=[float(x) for x in (sequence.logprobs or [])],
                stopped=sequence.stop_reason == "stop",
            )

        return RemoteGenerator(sample, tokenizer, "tinker")

    def close(self, outcome: str = "success") -> None:
        try:
            client = getattr(self, "service_client", None)
            if client is not None:
                client.close(outcome).result(timeout=30)
        except Exception as exc:  # the session expires on its own once heartbeats stop
            logger.warning("closing the tinker session failed (it expires without heartbeats): %s", exc)


class TinkerProcessor(RemoteProcessor):
    name = "tinker"
    sdk_package = "tinker"
    sdk_install = "tinker==0.38.0"
    api_key_env = "TINKER_API_KEY"

    def open_session(self, resume: CheckpointRecord | None) -> TinkerSession:
        import os

        return TinkerSession(self.config, resume, os.environ[self.api_key_env])
