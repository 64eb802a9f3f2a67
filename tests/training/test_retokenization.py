"""Retokenization drift: the rollout engine renders each finished conversation again through the
tokenizer's chat template and says where its ids stop being the ones generated; the store's record
keeps the flag and the position. Driven with the tiny character tokenizer and a scripted model."""

from __future__ import annotations

import io

from training.agents.spec import AgentSpec
from training.config import Config
from training.rendering import encode
from training.rollouts.episode_runner import EpisodeRunner
from training.rollouts.generation import GenerationOutput
from training.rollouts.tiny import build_char_tokenizer
from training.tracking.episodes import episode_record, read_records, to_parquet
from training.types import Action, RewardOutput

from test_episode_runner import ChatAgent, make_env  # the engine tests' agent and environment

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
            "{% if m['role'] == 'assistant' %}</s>{% endif %}{{ '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def templated(extra_chars: str = ""):
    tokenizer = build_char_tokenizer(extra_chars)
    tokenizer.chat_template = TEMPLATE
    return tokenizer


class Replies:
    """Stands in for the model: answers each call with the next given token ids (then EOS)."""

    def __init__(self, tokenizer, replies: list[list[int]]) -> None:
        self.tokenizer, self.replies = tokenizer, list(replies)

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
        completion = (self.replies.pop(0) + [self.tokenizer.eos_token_id])[:max_new_tokens]
        text = self.tokenizer.decode(completion, skip_special_tokens=True)
        return GenerationOutput(text, list(prompt_ids), completion, [-0.25] * len(completion), "stop")


class TidyAgent(ChatAgent):
    """Keeps each reply in its history stripped of surrounding spaces: the conversation rendered
    again is no longer what the model saw and wrote."""

    def update_from_model(self, response: str, **kwargs) -> Action:
        return super().update_from_model(response.strip(), **kwargs)


def run(tokenizer, replies, agent=ChatAgent, single_turn=False):
    """One episode of ``agent`` in a two-turn environment, or of a single-turn prompt "2+2="."""
    config = Config.build({"rllm.agent.max_steps": 4, "rllm.agent.max_tokens_per_turn": 20})
    spec = AgentSpec() if single_turn else AgentSpec(agent_class=agent, env_class=make_env("Env"))
    reward = (lambda task, text: RewardOutput(1.0, True)) if single_turn else None
    runner = EpisodeRunner(spec.validate(), Replies(tokenizer, replies), tokenizer, config, reward)
    [episode] = runner.run([{"prompt": "2+2="} if single_turn else {"turns": 2}])
    return episode


def test_a_conversation_that_renders_back_to_its_ids_has_no_drift():
    tokenizer = templated()
    episode = run(tokenizer, [encode(tokenizer, "ok"), encode(tokenizer, "ok")])
    assert episode.info["retokenization"] == {"drift": False, "position": None}
    record = episode_record(episode, split="train", step=1, position=0, group="g", group_position=0)
    assert (record["retokenization_drift"], record["drift_position"]) == (False, None)


def test_an_agent_that_rewrites_its_reply_drifts_where_the_reply_begins():
    tokenizer = templated()
    episode = run(tokenizer, [encode(tokenizer, " ok"), encode(tokenizer, "ok")], agent=TidyAgent)
    first_prompt = encode(tokenizer, "<user>Q:\n<assistant>")
    assert episode.prompt_ids == first_prompt
    assert episode.info["retokenization"] == {"drift": True, "position": len(first_prompt)}  # the space it dropped
    record = episode_record(episode, split="train", step=1, position=0, group="g", group_position=0)
    [stored] = read_records(io.BytesIO(to_parquet([record])))
    assert (stored["retokenization_drift"], stored["drift_position"]) == (True, len(first_prompt))


def test_tokens_the_tokenizer_would_merge_drift_where_they_were_generated_apart():
    tokenizer = build_char_tokenizer("é")  # one token for "é", built from its two byte pieces
    merged = encode(tokenizer, "é")
    pieces = tokenizer.convert_tokens_to_ids(list(tokenizer.convert_ids_to_tokens(merged)[0]))
    assert len(merged) == 1 and len(pieces) == 2 and tokenizer.decode(pieces) == "é"
    apart = run(tokenizer, [pieces], single_turn=True)
    assert apart.info["retokenization"] == {"drift": True, "position": len(encode(tokenizer, "2+2="))}
    together = run(tokenizer, [merged], single_turn=True)
    assert together.info["retokenization"] == {"drift": False, "position": None}


def test_a_conversation_without_a_chat_template_is_not_checked():
    tokenizer = build_char_tokenizer()
    episode = run(tokenizer, [encode(tokenizer, "ok"), encode(tokenizer, "ok")])
    assert "retokenization" not in episode.info
    record = episode_record(episode, split="train", step=1, position=0, group="g", group_position=0)
    assert (record["retokenization_drift"], record["drift_position"]) == (None, None)
