"""A workflow whose episodes hold two conversations, each rewarded on its own, for the backends'
tests that every trajectory of an episode is trained (as in rLLM's solver-judge workflow)."""

from task_rewards import starts_a_to_m
from training import Episode, Step, Trajectory, Workflow

NAMES = ("first", "second")


class TwoConversations(Workflow):
    """Asks the model twice, in two separate conversations ('first: x=' and 'second: x='); each
    trajectory earns 1 when its reply starts with one of a-m. The episode is correct when both do."""

    async def run(self, task, uid, **kwargs):
        trajectories = []
        for name in NAMES:
            output = await self.rollout_engine.get_model_response([{"role": "user", "content": f"{name}: {task['prompt']}"}])
            reward = starts_a_to_m(task, output.content)
            trajectories.append(Trajectory(name=name, steps=[Step(model_output=output, reward=reward)], reward=reward))
        return Episode(trajectories=trajectories, is_correct=all(t.reward == 1.0 for t in trajectories))


def datums_by_conversation(batch: list[dict], tasks: list[dict]) -> dict[str, list[dict]]:
    """The datums of one forward_backward call (as the stand-ins record them), by the
    conversation whose prompt they start with."""
    from training.rendering import encode, render_messages
    from training.rollouts.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    found: dict[str, list[dict]] = {}
    for name in NAMES:
        prompts = [encode(tokenizer, render_messages(tokenizer, [{"role": "user", "content": f"{name}: {t['prompt']}"}])) for t in tasks]
        found[name] = [d for d in batch if any(d["input"][: len(p)] == p for p in prompts)]
    return found
