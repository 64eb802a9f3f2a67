"""rLLM-style ``agent_run_func`` episodes: ``fn(**task)`` calls the policy through the trainer's
OpenAI-compatible endpoint with the real ``openai`` client library, and each call's exact tokens
and logprobs become the episode's trainable tokens."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch

from training.agents.spec import AgentSpec
from training.config import Config
from training.rollouts.generation import GenerationOutput, HFBatchGenerator
from training.rendering import encode
from training.rollouts.episode_runner import EpisodeRunner
from training.errors import ModelCallError
from training.agents.sdk import current_base_url, get_chat_client, get_chat_client_async
from training.rollouts.chat_endpoint import ChatEndpoint
from training.rollouts.tiny import build_char_tokenizer, build_tiny_model
from training.types import RewardOutput, TerminationReason

TOKENIZER = build_char_tokenizer()
MODEL = build_tiny_model(TOKENIZER)
EOS = TOKENIZER.eos_token_id


def engine(func, overrides=None, generator=None, reward_fn=None, endpoint=None) -> EpisodeRunner:
    config = Config.build({"rllm.agent.max_tokens_per_turn": 6, **(overrides or {})})
    generator = generator or HFBatchGenerator(MODEL, TOKENIZER, seed=0)
    return EpisodeRunner(AgentSpec(agent_run_func=func).validate(), generator, TOKENIZER, config, reward_fn, endpoint)


def policy_logprobs(prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    """The policy's log-probabilities of ``completion_ids`` after ``prompt_ids`` (temperature 1)."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.inference_mode():
        logits = MODEL(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion_ids)[:, None]).squeeze(-1).tolist()


def test_the_two_forms_are_told_apart_by_signature():
    def rllm_form(**kwargs): ...
    def named_fields(question, ground_truth, **kwargs): ...
    def two_fields(question, answer): ...
    def ours(task, model): ...

    styles = [AgentSpec(agent_run_func=f).run_func_style for f in (rllm_form, named_fields, two_fields, ours)]
    assert styles == ["kwargs", "kwargs", "kwargs", "task_model"]


def test_a_sync_function_with_get_chat_client_records_exact_tokens_and_logprobs():
    seen = []

    def rollout(**kwargs):
        client = get_chat_client(base_url="http://localhost:4000/v1", api_key="EMPTY")  # rLLM's proxy address
        response = client.chat.completions.create(
            model="any-name", messages=[{"role": "user", "content": kwargs["question"]}], logprobs=True
        )
        seen.append(response)
        return 1.0 if response.choices[0].message.content else 0.5

    [episode] = engine(rollout).run([{"question": "2+2="}])
    assert episode.termination_reason == TerminationReason.ENV_DONE, episode.error
    [response] = seen
    choice = response.choices[0]
    # What the client was told is exactly what the episode trains on.
    assert episode.prompt_ids == encode(TOKENIZER, "2+2=") == response.model_extra["prompt_token_ids"]
    assert episode.response_ids == choice.model_extra["token_ids"]
    assert episode.response_mask == [1] * len(episode.response_ids)
    assert [t.logprob for t in choice.logprobs.content] == episode.response_logprobs
    assert choice.message.content == TOKENIZER.decode(episode.response_ids, skip_special_tokens=True)
    assert response.usage.completion_tokens == len(episode.response_ids)
    # The logprobs are the policy's own, the ones the trainer recomputes.
    assert episode.response_logprobs == pytest.approx(policy_logprobs(episode.prompt_ids, episode.response_ids), abs=1e-4)
    step = episode.trajectories[0].steps[0]
    assert step.prompt_ids == episode.prompt_ids and step.logprobs == episode.response_logprobs


def test_an_async_multi_turn_conversation_is_one_token_sequence_with_its_own_text_masked():
    async def rollout(question, base_url, **kwargs):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY")
        messages = [{"role": "user", "content": question}]
        first = await client.chat.completions.create(model="m", messages=messages, max_tokens=3)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": " again:"}]
        await client.chat.completions.create(model="m", messages=messages, max_tokens=3)
        await client.close()
        return RewardOutput(reward=0.25, is_correct=False)

    [episode] = engine(rollout).run([{"question": "Q:"}])
    assert episode.termination_reason == TerminationReason.ENV_DONE, episode.error
    assert len(episode.trajectories[0].steps) == 2 and episode.reward == 0.25
    assert episode.prompt_ids == encode(TOKENIZER, "Q:")
    user_turn = [t for t, m in zip(episode.response_ids, episode.response_mask) if m == 0]
    assert TOKENIZER.decode(user_turn) == " again:"
    assert sum(episode.response_mask) == sum(len(s.response_ids) for s in episode.trajectories[0].steps)


def test_a_function_may_name_client_and_gets_a_ready_one():
    def rollout(question, client, **kwargs):
        assert isinstance(client, openai.OpenAI) and str(client.base_url) == current_base_url() + "/"
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": question}])
        return True

    episodes = engine(rollout).run([{"question": "hi"}], n=2)
    assert [(e.reward, e.is_correct) for e in episodes] == [(1.0, True)] * 2


def test_the_run_keeps_one_endpoint_and_sessions_end_with_their_episode():
    urls = []

    def rollout(**kwargs):
        urls.append(current_base_url())
        get_chat_client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        return 0.0

    with ChatEndpoint(tokenizer=TOKENIZER) as endpoint:
        engine(rollout, endpoint=endpoint).run([{}], n=2)
        engine(rollout, endpoint=endpoint).run([{}])
        assert len({url.split("/sessions/")[0] for url in urls}) == 1 and len(set(urls)) == 3
        models = httpx.get(endpoint.base_url + "/models").json()
        assert models["data"][0]["id"] == "policy"
        ended = openai.OpenAI(base_url=urls[0], api_key="EMPTY", max_retries=0)
        with pytest.raises(openai.NotFoundError, match="episode this base_url belongs to has ended"):
            ended.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert current_base_url() is None
    with pytest.raises(httpx.ConnectError):  # stopped with the run
        httpx.get(endpoint.base_url + "/models")


class Scripted:
    """Stands in for the model where a test needs a given reply (a tool call the tiny model would
    never write): answers each call with the next text plus EOS, every token with logprob -0.5."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)

    async def generate(self, prompt_ids, max_new_tokens):
        completion = encode(TOKENIZER, self.texts.pop(0)) + [EOS]
        text = TOKENIZER.decode(completion, skip_special_tokens=True)
        return GenerationOutput(text, list(prompt_ids), completion, [-0.5] * len(completion), "stop")


def test_tool_calls_come_back_as_openai_tool_calls_and_the_conversation_stays_one_sequence():
    tools = [{"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    seen = {}

    def rollout(question, **kwargs):
        client = get_chat_client()
        messages = [{"role": "user", "content": question}]
        first = client.chat.completions.create(model="m", messages=messages, tools=tools)
        [call] = first.choices[0].message.tool_calls
        arguments = json.loads(call.function.arguments)
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])}]
        second = client.chat.completions.create(model="m", messages=messages, tools=tools)
        seen.update(first=first.choices[0], call=call, arguments=arguments, answer=second.choices[0].message.content)
        return 1.0 if seen["answer"] == "7" else 0.0

    tool_call = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    [episode] = engine(rollout, overrides={"rllm.agent.max_tokens_per_turn": 80, "data.max_response_length": 200,
                                                 "data.max_prompt_length": 2048},
                       generator=Scripted(tool_call, "7")).run([{"question": "3+4?"}])
    assert episode.error is None and episode.reward == 1.0
    assert seen["first"].finish_reason == "tool_calls" and seen["call"].function.name == "add"
    assert seen["arguments"] == {"a": 3, "b": 4} and seen["first"].message.content is None
    # The tools are described to the model in the system turn, as for chat agents.
    prompt = TOKENIZER.decode(episode.prompt_ids)
    assert prompt.startswith("# Tools") and '"name": "add"' in prompt and prompt.endswith("3+4?")
    # One sequence: the call as the model wrote it (trained), the tool's result (masked), the answer (trained).
    trained = TOKENIZER.decode([t for t, m in zip(episode.response_ids, episode.response_mask) if m == 1])
    masked = TOKENIZER.decode([t for t, m in zip(episode.response_ids, episode.response_mask) if m == 0])
    assert trained == f"{tool_call}</s>7</s>" and masked == "7"


# -- bad input -----------------------------------------------------------------------------------

def test_a_function_that_never_calls_the_model_is_an_error_episode_that_says_so():
    def rollout(**kwargs):
        return 1.0

    [episode] = engine(rollout).run([{}])
    assert episode.termination_reason == TerminationReason.ERROR and episode.reward == 0.0
    assert "agent_run_func test_a_function_that_never_calls_the_model" in episode.error
    assert "returned without calling the model" in episode.error


def test_a_function_that_raises_is_an_error_episode_with_its_traceback():
    def rollout(question, **kwargs):
        get_chat_client().chat.completions.create(model="m", messages=[{"role": "user", "content": question}])
        raise KeyError("ground_truth")

    [episode] = engine(rollout).run([{"question": "q"}])
    assert episode.termination_reason == TerminationReason.ERROR
    assert episode.error == "KeyError: 'ground_truth'"
    assert 'raise KeyError("ground_truth")' in episode.info["traceback"]
    assert episode.prompt_ids == encode(TOKENIZER, "q")  # the calls made are kept


def test_a_wrong_return_type_is_an_error_episode():
    def rollout(**kwargs):
        get_chat_client().chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        return "yes"

    [episode] = engine(rollout).run([{}])
    assert "agent_run_func returned str; return a float reward" in episode.error


@pytest.mark.parametrize(
    ("request_args", "message"),
    [
        ({"stream": True}, "stream=true is not supported"),
        ({"n": 2}, "n=2 is not supported"),
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "only text content parts are supported"),
        ({"tools": [{"name": "f"}]}, "tools must be a list of {type: function"),
    ],
    ids=["stream", "n", "max_tokens", "no_messages", "image", "tools"],
)
def test_requests_the_endpoint_cannot_serve_are_refused_by_name(request_args, message):
    errors = []

    def rollout(**kwargs):
        client = get_chat_client(max_retries=0)
        args = {"model": "m", "messages": [{"role": "user", "content": "q"}], **request_args}
        try:
            client.chat.completions.create(**args)
        except openai.BadRequestError as exc:
            errors.append(exc.body["message"])
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        return 0.0

    [episode] = engine(rollout).run([{}])
    assert episode.error is None and message in errors[0]


def test_chat_without_a_session_is_refused():
    with ChatEndpoint(tokenizer=TOKENIZER) as endpoint:
        client = openai.OpenAI(base_url=endpoint.base_url, api_key="EMPTY", max_retries=0)
        with pytest.raises(openai.NotFoundError, match="use the base_url the trainer hands to agent_run_func"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])


def test_a_broken_model_stops_the_rollout_instead_of_counting_as_agent_errors():
    class Broken:
        async def generate(self, prompt_ids, max_new_tokens):
            raise RuntimeError("CUDA out of memory")

    async def rollout(**kwargs):
        await get_chat_client_async(max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "q"}]
        )
        return 1.0

    with pytest.raises(ModelCallError, match="CUDA out of memory"):
        engine(rollout, generator=Broken()).run([{}])


def test_outside_an_episode_get_chat_client_is_a_plain_client():
    client = get_chat_client(base_url="http://example.invalid/v1", api_key="k")
    assert str(client.base_url) == "http://example.invalid/v1/" and current_base_url() is None
    with pytest.raises(ValueError, match="only 'openai' is supported"):
        get_chat_client("anthropic")



def test_the_client_library_does_not_log_a_line_per_call(caplog):
    def rollout(**kwargs):
        get_chat_client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        return 0.0

    with caplog.at_level("INFO"):
        episodes = engine(rollout).run([{}], n=2)
    assert [e.error for e in episodes] == [None, None]
    assert not [r for r in caplog.records if "/sessions/" in r.getMessage()]
