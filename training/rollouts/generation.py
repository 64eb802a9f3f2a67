"""Token generation for rollouts: a batching Hugging Face generator and the client agents call.

Many episodes run as asyncio tasks; each asks for one completion at a time. ``HFBatchGenerator``
gathers the requests that are waiting at the same moment into one batched forward loop, so 64
concurrent episodes cost one batched generation per turn instead of 64 separate ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from training.rendering import encode, render_messages
from training.types import ModelOutput, Step
from training.agents.workflow import RolloutEngine


@dataclass
class GenerationOutput:
    """One completion. ``finish_reason`` is ``"stop"`` when the model wrote EOS (kept as the last
    id of ``completion_ids``) and ``"length"`` when it ran out of ``max_new_tokens``."""

    text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class TokenGenerator(Protocol):
    """Anything that turns prompt ids into a completion: the HF batcher, a vLLM client, a test fake.

    A generator may also offer ``session()``, a context manager the rollout engine enters around
    each episode, so that it knows how many callers may still ask before it starts a batch.
    """

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput: ...


@dataclass
class _Request:
    prompt_ids: list[int]
    max_new_tokens: int
    future: asyncio.Future = field(repr=False)


class HFBatchGenerator:
    """Batched sampling from a Hugging Face causal LM for concurrent asyncio callers.

    A request waits until the event loop has nothing else to run and, when callers announce
    themselves with ``session()``, until every open session is waiting (or ``max_wait_s`` has
    passed, so one slow environment does not hold up the rest). Then all waiting requests run as
    one left-padded batch with a KV cache; requests that arrive meanwhile go into the next batch.
    The batch runs on the event-loop thread, which keeps the batches deterministic.

    ``logprobs`` are the sampled tokens' log-probabilities under ``log_softmax(logits / temperature)``,
    before top-p truncation: the distribution the trainer recomputes from the policy.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        max_batch_size: int | None = None,
        max_wait_s: float = 0.05,
        do_sample: bool = True,
        top_k: int = -1,
    ) -> None:
        """``seed`` fixes the sampling stream (None: torch's global RNG). ``max_batch_size`` splits
        larger batches to bound memory. ``max_wait_s`` bounds how long a batch waits for open
        sessions that are still busy elsewhere (an environment step in a thread, a tool call).
        ``do_sample=False`` decodes greedily (the most likely token; ``top_p`` and ``top_k`` are unused).
        ``top_k`` keeps the k likeliest tokens before ``top_p`` truncates (-1 or 0: off, as in verl)."""
        if temperature <= 0:
            raise ValueError(f"temperature must be greater than 0, got {temperature}.")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.do_sample = do_sample
        self._sessions = 0
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)
        self._seed = seed
        self._rng: torch.Generator | None = None
        self._pending: list[_Request] = []
        self._worker: asyncio.Task | None = None
        self.batch_sizes: list[int] = []  # one entry per batch run, for metrics and tests

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Announce a caller (an episode) that will ask for tokens until the block ends."""
        self._sessions += 1
        try:
            yield
        finally:
            self._sessions -= 1

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
        """Queue one request and wait for the batch that serves it."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; a prompt needs at least one token.")
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), max(0, int(max_new_tokens)), loop.create_future())
        self._pending.append(request)
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._serve())
        return await request.future

    async def _serve(self) -> None:
        """Run batches while requests wait. Never raises: failures go to the requests' futures."""
        while self._pending:
            await self._settle()
            batch = [r for r in self._pending if not r.future.done()]  # drop cancelled callers
            self._pending = []
            size = self.max_batch_size or len(batch) or 1
            for start in range(0, len(batch), size):
                chunk = batch[start : start + size]
                self.batch_sizes.append(len(chunk))
                try:
                    outputs = self.generate_batch([r.prompt_ids for r in chunk], [r.max_new_tokens for r in chunk])
                except Exception as exc:  # hand the failure to every caller of this batch
                    for request in chunk:
                        if not request.future.done():
                            request.future.set_exception(exc)
                    continue
                for request, output in zip(chunk, outputs):
                    if not request.future.done():
                        request.future.set_result(output)

    async def _settle(self) -> None:
        """Wait until the loop has no other runnable work and every open session is waiting."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while True:
            seen = -1
            while len(self._pending) != seen:  # let every runnable task reach its next await
                seen = len(self._pending)
                for _ in range(3):
                    await asyncio.sleep(0)
            waiting = sum(not r.future.done() for r in self._pending)
            if waiting >= self._sessions or loop.time() >= deadline:
                return
            await asyncio.sleep(0.001)  # a session is busy in a thread or elsewhere

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: list[int]) -> list[GenerationOutput]:
        """Sample completions for ``prompts`` in one batch (synchronous; ``generate`` is the async door)."""
        model = self.model
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                completions, logprobs, finish = self._sample(prompts, max_new_tokens)
        finally:
            model.train(was_training)
        return [
            GenerationOutput(
                text=self.tokenizer.decode(ids, skip_special_tokens=True),
                prompt_ids=list(prompt),
                completion_ids=ids,
                logprobs=lps,
                finish_reason=reason,
            )
            for prompt, ids, lps, reason in zip(prompts, completions, logprobs, finish)
        ]

    def _sample(
        self, prompts: list[list[int]], max_new_tokens: list[int]
    ) -> tuple[list[list[int]], list[list[float]], list[str]]:
        device = next(self.model.parameters()).device
        batch = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        limits = torch.tensor(max_new_tokens, device=device)
        eos = torch.tensor(sorted(self.eos_ids), device=device)
        finished = limits <= 0
        completions: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        stopped = [False] * batch
        past = None
        step = 0
        while not bool(finished.all()):
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention,
                position_ids=positions,
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            log_probs = torch.log_softmax(out.logits[:, -1, :].float() / self.temperature, dim=-1)
            tokens = self._pick(log_probs)
            token_logprobs = log_probs.gather(-1, tokens[:, None]).squeeze(-1)
            for i in (~finished).nonzero().flatten().tolist():
                completions[i].append(int(tokens[i]))
                logprobs[i].append(float(token_logprobs[i]))
            is_eos = torch.isin(tokens, eos) & ~finished
            for i in is_eos.nonzero().flatten().tolist():
                stopped[i] = True
            step += 1
            finished = finished | is_eos | (limits <= step)
            # Finished rows keep stepping on pad tokens; their outputs are ignored.
            input_ids = torch.where(finished, self.pad_id, tokens)[:, None]
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=-1)
            positions = positions[:, -1:] + 1
        return completions, logprobs, ["stop" if s else "length" for s in stopped]

    def _pick(self, log_probs: torch.Tensor) -> torch.Tensor:
        """Sample one token per row, with top-k then nucleus (top-p) truncation; the argmax when not sampling."""
        if not self.do_sample:
            return log_probs.argmax(dim=-1)
        probs = log_probs.exp()
        if 0 < self.top_k < probs.shape[-1]:
            kth = probs.topk(self.top_k, dim=-1).values[..., -1:]
            probs = probs.masked_fill(probs < kth, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # Drop a token when the tokens before it already cover top_p; the first always stays.
            drop = sorted_probs.cumsum(-1) - sorted_probs > self.top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        return torch.multinomial(probs, 1, generator=self._generator(probs.device)).squeeze(-1)

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self._seed is None:
            return None
        if self._rng is None or self._rng.device != device:
            self._rng = torch.Generator(device=device)
            self._rng.manual_seed(self._seed)
        return self._rng


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """The tokenizer's EOS plus the model's generation EOS ids (chat models often stop on several)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    generation_config = getattr(model, "generation_config", None)
    extra = getattr(generation_config, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(int(i) for i in extra)
    if not ids:
        raise ValueError("The tokenizer has no eos_token_id, so generation could never stop; set tokenizer.eos_token.")
    return ids


def continuation(tokenizer: Any, prompt_text: str, output: GenerationOutput, text: str) -> str | None:
    """What ``text`` adds after ``prompt_text`` followed by the model's reply ``output``, or None
    when it does not continue them.

    The reply is looked for as the model wrote it (with its end-of-turn token, as a chat template
    renders it) and as plain text (a plain rendering drops the EOS). Callers then extend the
    earlier token ids instead of re-tokenising the conversation: re-tokenised text can give other
    ids than the ones sampled, and the trainer must see exactly what the model saw.
    """
    if not text.startswith(prompt_text):
        return None
    rest = text[len(prompt_text) :]
    for reply in (tokenizer.decode(output.completion_ids), output.text):
        if rest.startswith(reply):
            return rest[len(reply) :]
    return None


class ModelClient(RolloutEngine):
    """What workflows and run functions call the model through. Every call is recorded in
    ``steps`` with its exact token ids, so the trainer learns from what the model really wrote.

    A call whose text continues the previous call's prompt and reply is sent as the previous
    ids + reply ids + the new text's ids, so a multi-call conversation is one token sequence.

    ``get_model_response`` (rLLM's name) returns a ``ModelOutput``; ``chat``/``complete`` return
    our ``GenerationOutput``. ``chat_sync``/``complete_sync`` are for a plain (non-async) run
    function, which the rollout engine runs in a worker thread.
    """

    def __init__(
        self, generator: TokenGenerator, tokenizer: Any, max_tokens_per_turn: int, max_response_length: int | None = None
    ) -> None:
        """``max_response_length``: the episode's response budget (``data.max_response_length``),
        read by workflows that share it out over their turns (rLLM's ``CumulativeWorkflow``)."""
        self.generator = generator
        self.tokenizer = tokenizer
        self.max_tokens_per_turn = max_tokens_per_turn
        self.max_response_length = max_response_length
        self.steps: list[Step] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last: tuple[str, GenerationOutput] | None = None  # the previous call's text and output

    async def chat(self, messages: list[dict], max_tokens: int | None = None) -> GenerationOutput:
        """Answer the last of ``messages`` (rendered with the tokenizer's chat template)."""
        return await self._call(list(messages), render_messages(self.tokenizer, messages), max_tokens)

    async def complete(self, prompt: str, max_tokens: int | None = None) -> GenerationOutput:
        """Continue raw ``prompt`` text."""
        return await self._call([{"role": "user", "content": prompt}], prompt, max_tokens)

    async def get_model_response(self, messages: list[dict], **kwargs: Any) -> ModelOutput:
        """rLLM's call: answer ``messages``; ``max_tokens`` is honoured, other sampling keywords are
        the run's (``actor_rollout_ref.rollout.*``). Reasoning in ``<think>...</think>`` is split
        from the content."""
        output = await self.chat(messages, max_tokens=kwargs.get("max_tokens"))
        reasoning, content = split_reasoning(output.text)
        model_output = ModelOutput(
            text=output.text,
            content=content,
            reasoning=reasoning,
            prompt_ids=list(output.prompt_ids),
            completion_ids=list(output.completion_ids),
            logprobs=list(output.logprobs),
            prompt_length=len(output.prompt_ids),
            completion_length=len(output.completion_ids),
            finish_reason=output.finish_reason,
        )
        self.steps[-1].model_output = model_output
        return model_output

    def chat_sync(self, messages: list[dict], max_tokens: int | None = None) -> GenerationOutput:
        return self._run_sync(self.chat(messages, max_tokens))

    def complete_sync(self, prompt: str, max_tokens: int | None = None) -> GenerationOutput:
        return self._run_sync(self.complete(prompt, max_tokens))

    @property
    def last_response(self) -> str:
        return self.steps[-1].model_response if self.steps else ""

    async def _call(self, messages: list[dict], text: str, max_tokens: int | None) -> GenerationOutput:
        self._loop = asyncio.get_running_loop()
        limit = self.max_tokens_per_turn if max_tokens is None else min(max_tokens, self.max_tokens_per_turn)
        added = continuation(self.tokenizer, *self._last, text) if self._last else None
        if added is None:
            prompt_ids = encode(self.tokenizer, text)
        else:
            prompt_ids = self._last[1].prompt_ids + self._last[1].completion_ids + encode(self.tokenizer, added)
        output = await self.generator.generate(prompt_ids, limit)
        self._last = (text, output)
        self.steps.append(
            Step(
                chat_completions=messages,
                model_response=output.text,
                prompt_ids=list(output.prompt_ids),
                response_ids=list(output.completion_ids),
                logprobs=list(output.logprobs),
            )
        )
        return output

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Name the event loop that serves ``*_sync`` calls from worker threads."""
        self._loop = loop

    def _run_sync(self, coroutine: Any) -> GenerationOutput:
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("ModelClient has no event loop; sync calls only work inside the rollout engine.")
        try:
            in_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            in_loop = False
        if in_loop:  # waiting here would block the loop that has to answer
            coroutine.close()
            raise RuntimeError("chat_sync/complete_sync called from async code; use `await chat(...)` there.")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()


def split_reasoning(text: str) -> tuple[str, str]:
    """``(reasoning, content)`` of a reply: the part inside ``<think>...</think>`` and the rest."""
    before, sep, after = text.partition("</think>")
    if not sep:
        return "", text
    return before.split("<think>", 1)[-1].strip(), after.strip()
