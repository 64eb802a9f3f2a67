"""Our agents inside verl: an agent loop (verl's ``AgentLoopBase``) that runs a ``BaseAgent`` +
``BaseEnv``, a ``Workflow`` or a run function, generating through verl's server manager.

The episode itself is run by our ``EpisodeRunner``, the same code the trl backend uses, so the
token view is identical on both backends: the first prompt is ``prompt_ids``; every later token
goes to the response, mask 1 where the model wrote it and 0 where the environment did; episodes
end with env_done, max_turns, max_prompt_length, max_response_length, timeout or error.
verl's agent loop returns one sample per episode, so an episode that lays out as several training
sequences (several trajectories, as rLLM's solver-judge; model calls that do not continue each
other) stops the run with ``MultiSequenceEpisode``, naming the backend and the workflow: it is
never trained on its first conversation alone.
Only the generator differs: here it is verl's server manager (vLLM or SGLang replicas), called
with token ids in and token ids out.

verl's agent loop workers import this module through ``actor_rollout_ref.model.external_lib``;
importing it registers the loop under ``AGENT_LOOP_NAME`` with verl's ``register`` decorator.
What to run (the AgentSpec, the reward function and our Config) travels pickled in the verl
config at ``agent_trainer.payload`` (see ``VerlProcessor.compose``).
"""

from __future__ import annotations

import time
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from training.backends.verl.backend import (
    AGENT_LOOP_NAME, EPISODE_RECORD_KEY, decode_object, episode_for_dump, task_from_extra_info,
)
from training.algorithms.episode_rows import single_sequence
from training.rollouts.generation import GenerationOutput
from training.rollouts.outcomes import OutcomeMonitor
from training.rollouts.episode_runner import EpisodeRunner
from training.tracking.episodes import token_pieces
from training.types import Episode, TerminationReason


class ServerManagerGenerator:
    """verl's server manager (``LLMServerClient.generate``) as our ``TokenGenerator``.

    All calls of one episode share ``request_id``, so the server manager keeps them on one server
    and its prefix cache. ``sampling_params`` are the ones verl hands the agent loop (temperature,
    top_p, top_k, logprobs); ``max_tokens`` is set per call.
    """

    def __init__(self, server_manager: Any, tokenizer: Any, sampling_params: dict[str, Any], request_id: str) -> None:
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.sampling_params = dict(sampling_params)
        self.request_id = request_id
        self.generate_s = 0.0
        # False once a reply came without log-probabilities (verl asked for none: ``calculate_log_probs``):
        # the episode's are then zeros that stand in for them, not the model's.
        self.logprobs_sampled = True

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
        started = time.perf_counter()
        output = await self.server_manager.generate(
            request_id=self.request_id,
            prompt_ids=list(prompt_ids),
            sampling_params={**self.sampling_params, "max_tokens": max(1, int(max_new_tokens))},
        )
        self.generate_s += time.perf_counter() - started
        ids = list(output.token_ids)
        logprobs = list(output.log_probs) if output.log_probs else [0.0] * len(ids)
        if ids and not output.log_probs:
            self.logprobs_sampled = False
        ran_out = output.stop_reason == "length" or len(ids) >= max_new_tokens
        return GenerationOutput(
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            prompt_ids=list(prompt_ids),
            completion_ids=ids,
            logprobs=logprobs,
            finish_reason="length" if ran_out else "stop",
        )


@register(AGENT_LOOP_NAME)
class AgentTrainerLoop(AgentLoopBase):
    """One episode per ``run`` call; verl calls it ``rollout.n`` times per dataset row."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        payload = decode_object(self.config.agent_trainer.payload)
        self.spec = payload["spec"]
        self.reward_fn = payload["reward_fn"]
        self.run_config = payload["config"]
        self.response_length = self.rollout_config.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra_info = kwargs.get("extra_info") or {}
        task = task_from_extra_info(extra_info)
        # A reward that raises stops the run naming the reward and the row (the step is verl's).
        row = extra_info.get("index")
        outcomes = OutcomeMonitor(self.run_config.trainer.max_episode_error_rate, {} if row is None else {int(row): task})
        reward_fn = outcomes.watch_reward(self.reward_fn, required=False)
        generator = ServerManagerGenerator(self.server_manager, self.tokenizer, sampling_params, uuid4().hex)
        engine = EpisodeRunner(self.spec, generator, self.tokenizer, self.run_config, reward_fn)
        started = time.perf_counter()
        (episode,) = await engine.run_episodes([task], n=1)
        elapsed = time.perf_counter() - started
        # verl takes one sample per episode: an episode of several sequences (rLLM's solver-judge)
        # stops the run, naming the workflow, rather than training its first conversation only.
        single_sequence(episode, self.run_config, "verl", self.spec.label)
        output = episode_to_output(episode, self.response_length, self._filler_token(), generator.generate_s, elapsed)
        if self.run_config.trainer.log_episodes:
            add_episode_record(output, episode, self.tokenizer, kwargs, logprobs_sampled=generator.logprobs_sampled)
        return output

    def _filler_token(self) -> int:
        for token in (self.tokenizer.eos_token_id, self.tokenizer.pad_token_id):
            if token is not None:
                return int(token)
        return 0


def add_episode_record(output: AgentLoopOutput, episode: Episode, tokenizer: Any, row: dict[str, Any],
                       logprobs_sampled: bool = True) -> None:
    """The episode store's record of ``episode`` rides verl's rollout dump to the driver, in
    ``reward_extra_info`` (``EPISODE_RECORD_KEY``; verl's default trainer dumps it only as our
    trainer class extends its dump, ``training.backends.verl.dumps``): with its group (verl's
    ``uid``), data source and dataset row (from verl's batch ``row``: ``uid``, ``data_source``,
    ``extra_info.index``), each turn's times as the turn loop measured them, and the tokens as
    handed to verl, each response token decoded alone; no log-probabilities unless the rollout
    sampled them (``logprobs_sampled``: verl hands the zeros that stand in for them to training)."""
    index = (row.get("extra_info") or {}).get("index")
    output.extra_fields["reward_extra_info"][EPISODE_RECORD_KEY] = episode_for_dump(
        episode, group=str(row.get("uid") or ""), data_source=str(row.get("data_source") or ""),
        row_index=None if index is None else int(index), prompt_ids=output.prompt_ids,
        response_ids=output.response_ids, response_mask=output.response_mask,
        response_logprobs=(output.response_logprobs or []) if logprobs_sampled else [],
        token_texts=token_pieces(tokenizer, list(output.response_ids)))


def episode_to_output(
    episode: Episode, response_length: int, filler_token: int, generate_s: float = 0.0, elapsed_s: float = 0.0
) -> AgentLoopOutput:
    """An Episode as verl's ``AgentLoopOutput``; the episode reward becomes ``reward_score``, so
    verl uses it instead of calling a reward function.

    The termination reason, error and traceback travel in ``reward_extra_info``, so verl's rollout
    dump carries them to the driver, where ``VerlMetricsBridge`` checks each step's error rate.

    verl needs at least one prompt and one response token per sample (it writes the reward on the
    last response token), so an episode without tokens (a too-long first prompt) gets one filler
    token on each side, masked out: it carries reward 0 and no gradient.
    """
    prompt_ids = list(episode.prompt_ids) or [filler_token]
    response_ids = list(episode.response_ids[:response_length])
    response_mask = list(episode.response_mask[:response_length])
    logprobs = list(episode.response_logprobs[:response_length])
    if not response_ids:
        response_ids, response_mask, logprobs = [filler_token], [0], [0.0]
    reason = episode.termination_reason or TerminationReason.ENV_DONE
    turns = int(episode.metrics.get("turns", episode.num_turns))
    step_rewards = [float(step.reward) for trajectory in episode.trajectories for step in trajectory.steps]
    return AgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        response_mask=response_mask,
        response_logprobs=logprobs,
        reward_score=float(episode.reward),
        num_turns=turns,
        metrics=AgentLoopMetrics(generate_sequences=generate_s, tool_calls=max(0.0, elapsed_s - generate_s)),
        extra_fields={
            "termination_reason": reason.value,
            "turn_scores": step_rewards,
            "tool_rewards": [],
            "reward_extra_info": {
                "acc": float(episode.is_correct),
                "termination_reason": reason.value,
                "error": episode.error or "",
                "traceback": episode.info.get("traceback", ""),
            },
        },
    )
