"""HFBatchGenerator: concurrent requests share one batched forward per token; logprobs are the
policy's; EOS stops a row; and the helpers agents use (render_messages, ModelClient)."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from training.rollouts.generation import GenerationOutput, HFBatchGenerator, ModelClient

from training.rendering import encode, render_messages
from training.rollouts.tiny import build_char_tokenizer, build_tiny_model




@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture
def model(tokenizer):
    return build_tiny_model(tokenizer, layers=2, hidden_size=64, seed=0)


class ForwardLog:
    """Wraps ``model.forward`` to record each call's batch size and the model's mode, and can
    force EOS for chosen rows at a chosen step."""

    def __init__(self, model, eos_id: int | None = None, force_eos: dict[int, int] | None = None) -> None:
        self.batch_sizes: list[int] = []
        self.training_flags: list[bool] = []
        self._model, self._inner, self._eos, self._force = model, model.forward, eos_id, force_eos or {}
        model.forward = self

    def __call__(self, *args, **kwargs):
        out = self._inner(*args, **kwargs)
        step = len(self.batch_sizes)
        self.batch_sizes.append(kwargs["input_ids"].shape[0])
        self.training_flags.append(self._model.training)
        for row, at_step in self._force.items():
            if step == at_step:
                out.logits[row, -1, :] = -1e9
                out.logits[row, -1, self._eos] = 1e9
        return out


def gather(generator, prompts, max_new_tokens):
    async def main():
        return await asyncio.gather(*(generator.generate(p, n) for p, n in zip(prompts, max_new_tokens)))

    return asyncio.run(main())


def test_concurrent_requests_share_one_batched_forward_per_token(tokenizer, model):
    log = ForwardLog(model)
    generator = HFBatchGenerator(model, tokenizer, seed=0)
    prompts = [encode(tokenizer, "x" * length) for length in (3, 9, 5, 1, 12, 7)]
    limits = [4, 2, 6, 6, 1, 3]
    outputs = gather(generator, prompts, limits)
    assert generator.batch_sizes == [6]
    assert set(log.batch_sizes) == {6}
    # One forward per generated position of the longest completion, not one per request.
    assert len(log.batch_sizes) == max(len(o.completion_ids) for o in outputs)
    for prompt, limit, output in zip(prompts, limits, outputs):
        assert output.prompt_ids == prompt
        assert 1 <= len(output.completion_ids) <= limit
        assert len(output.logprobs) == len(output.completion_ids)
        assert all(math.isfinite(lp) and lp <= 0 for lp in output.logprobs)
        ended_on_eos = output.completion_ids[-1] == tokenizer.eos_token_id
        assert output.finish_reason == ("stop" if ended_on_eos else "length")
        if output.finish_reason == "length":
            assert len(output.completion_ids) == limit


def test_requests_arriving_during_a_batch_wait_for_the_next(tokenizer, model):
    generator = HFBatchGenerator(model, tokenizer, seed=0)
    prompt = encode(tokenizer, "abc")

    async def main():
        first = await asyncio.gather(*(generator.generate(prompt, 2) for _ in range(3)))
        second = await asyncio.gather(*(generator.generate(prompt, 2) for _ in range(5)))
        return first + second

    assert len(asyncio.run(main())) == 8
    assert generator.batch_sizes == [3, 5]


def test_eos_stops_only_its_own_row(tokenizer, model):
    ForwardLog(model, eos_id=tokenizer.eos_token_id, force_eos={0: 1})
    generator = HFBatchGenerator(model, tokenizer, seed=0)
    prompts = [encode(tokenizer, "hello"), encode(tokenizer, "hi")]
    first, second = gather(generator, prompts, [6, 6])
    assert first.finish_reason == "stop"
    assert len(first.completion_ids) == 2 and first.completion_ids[-1] == tokenizer.eos_token_id
    assert first.text == tokenizer.decode(first.completion_ids[:-1])  # EOS is not part of the text
    assert first.logprobs[-1] == pytest.approx(0.0, abs=1e-6)
    if tokenizer.eos_token_id not in second.completion_ids:
        assert second.finish_reason == "length" and len(second.completion_ids) == 6


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_full_forward_of_the_sampled_sequence(tokenizer, model, temperature):
    """KV cache, left padding and position ids must give the same numbers as one plain forward."""
    generator = HFBatchGenerator(model, tokenizer, temperature=temperature, seed=1)
    prompts = [encode(tokenizer, "a longer prompt here"), encode(tokenizer, "short")]
    for output in gather(generator, prompts, [8, 8]):
        ids = torch.tensor([output.prompt_ids + output.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(output.prompt_ids) - 1 : -1] / temperature
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(output.completion_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(output.logprobs), expected, atol=1e-4)


def test_seed_makes_sampling_repeatable_and_tiny_top_p_is_greedy(tokenizer, model):
    prompts = [encode(tokenizer, "repeat me"), encode(tokenizer, "and me")]
    first = gather(HFBatchGenerator(model, tokenizer, seed=7), prompts, [5, 5])
    second = gather(HFBatchGenerator(model, tokenizer, seed=7), prompts, [5, 5])
    assert [o.completion_ids for o in first] == [o.completion_ids for o in second]
    greedy = gather(HFBatchGenerator(model, tokenizer, top_p=1e-6, seed=3), prompts[:1], [1])[0]
    with torch.no_grad():
        best = int(model(torch.tensor([prompts[0]])).logits[0, -1].argmax())
    assert greedy.completion_ids == [best]


def test_model_is_in_eval_mode_while_generating_and_mode_is_restored(tokenizer, model):
    log = ForwardLog(model)
    model.train()
    gather(HFBatchGenerator(model, tokenizer), [encode(tokenizer, "x")], [2])
    assert log.training_flags and not any(log.training_flags)
    assert model.training
    model.eval()
    gather(HFBatchGenerator(model, tokenizer), [encode(tokenizer, "x")], [1])
    assert not model.training


def test_a_failing_batch_reaches_every_caller(tokenizer, model):
    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    model.forward = broken
    generator = HFBatchGenerator(model, tokenizer)

    async def main():
        return await asyncio.gather(*(generator.generate([5], 2) for _ in range(3)), return_exceptions=True)

    results = asyncio.run(main())
    assert [str(r) for r in results] == ["out of memory"] * 3


def test_max_batch_size_splits_batches(tokenizer, model):
    generator = HFBatchGenerator(model, tokenizer, max_batch_size=2)
    gather(generator, [encode(tokenizer, "ab")] * 5, [1] * 5)
    assert generator.batch_sizes == [2, 2, 1]


def test_render_messages_without_chat_template_concatenates_contents(tokenizer):
    messages = [{"role": "system", "content": "Rules.\n"}, {"role": "user", "content": "2+2="}]
    assert render_messages(tokenizer, messages) == "Rules.\n2+2="


def test_render_messages_uses_the_chat_template_when_there_is_one():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    messages = [{"role": "user", "content": "hi"}]
    assert render_messages(tokenizer, messages) == "[user]hi[assistant]"
    assert render_messages(tokenizer, messages, add_generation_prompt=False) == "[user]hi"


class EchoGenerator:
    """Stands in for the model: answers "ok" + EOS, so the recorded ids are known exactly."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.limits: list[int] = []

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
        self.limits.append(max_new_tokens)
        ids = encode(self.tokenizer, "ok") + [self.tokenizer.eos_token_id]
        return GenerationOutput("ok", list(prompt_ids), ids, [-0.5] * len(ids), "stop")


def test_model_client_records_each_call_with_its_tokens(tokenizer):
    generator = EchoGenerator(tokenizer)
    client = ModelClient(generator, tokenizer, max_tokens_per_turn=7)

    async def main():
        await client.chat([{"role": "user", "content": "Q?"}])
        await client.complete("Go:", max_tokens=3)

    asyncio.run(main())
    assert [s.model_response for s in client.steps] == ["ok", "ok"]
    assert client.steps[0].prompt_ids == encode(tokenizer, "Q?")
    assert client.steps[1].prompt_ids == encode(tokenizer, "Go:")
    assert client.steps[1].response_ids == encode(tokenizer, "ok") + [tokenizer.eos_token_id]
    assert client.steps[0].chat_completions == [{"role": "user", "content": "Q?"}]
    assert generator.limits == [7, 3]
    assert client.last_response == "ok"


def test_model_client_continues_the_previous_ids_when_the_conversation_goes_on(tokenizer):
    client = ModelClient(EchoGenerator(tokenizer), tokenizer, max_tokens_per_turn=7)
    ok = encode(tokenizer, "ok") + [tokenizer.eos_token_id]

    async def main():
        first = [{"role": "user", "content": "Q?"}]
        await client.chat(first)
        await client.chat(first + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}])
        await client.complete("Fresh start")

    asyncio.run(main())
    # The reply's EOS stays in the context: the model is shown exactly the tokens it wrote.
    assert client.steps[1].prompt_ids == encode(tokenizer, "Q?") + ok + encode(tokenizer, "more")
    assert client.steps[2].prompt_ids == encode(tokenizer, "Fresh start")


def test_sync_calls_need_the_engine_loop(tokenizer):
    client = ModelClient(EchoGenerator(tokenizer), tokenizer, max_tokens_per_turn=4)
    with pytest.raises(RuntimeError, match="no event loop"):
        client.complete_sync("x")
