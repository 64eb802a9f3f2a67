"""What a person reads can be read, on a desktop and on a 390 px phone.

- Contrast: WCAG AA (4.5:1 for text, 3:1 for large text) on every page, judged by axe-core (the
  axe.min.js that axe-playwright-python ships, run inside the page), and the episode viewer's
  trained text judged again from its computed colours.
- The episode viewer shows what the library recorded (tests/training/test_episode_records.py):
  each turn's prompt (a chat agent's system prompt included), the model's reply, the environment's
  reply to it (not the turn's input again); a single-turn episode its prompt, no observation and
  its real count of trained tokens; every heading on a line of its own.
- At 390 px no element reaches past the screen except inside a box that scrolls, no table cell
  breaks a word, and the menu folds behind a button.
- Both on the runs table with added columns, grouped by tag, its column picker open, and on the
  compare page with its config diff and the scatter's written run names.

The episodes are recorded by the library itself, as a worker records them: the rollout engine
runs the FrozenLake example and a chat agent against a stand-in for the model that answers given
texts (so the turns are known), and TRL trains the tiny model one single-turn step.

One live platform and one browser for all the browser tests (tests/browser/conftest.py)."""

from __future__ import annotations

import concurrent.futures

import pytest

from training.tracking.episodes import episode_record
from training.types import Episode, Step, Trajectory
from webapp.dashboard.episodes import store_step
from webapp.dashboard.models import EpisodeSample
from webapp.dashboard.recording import episode_row
from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import RunTableView

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESKTOP = {"width": 1400, "height": 900}
PHONE = {"width": 390, "height": 844}
SYSTEM_PROMPT = "You are a careful calculator."
LONG_KEY = "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio"
# Position of each recorded episode in the run's step 1 (its row in the viewer's list).
FROZENLAKE, CHAT_AGENT, SINGLE_TURN = 0, 1, 2


# -- episodes, recorded by the library ------------------------------------------------------------


def _record_episodes(run_path: str) -> list[dict]:
    """The FrozenLake example (two turns from 22: down to 32, right onto the goal 33), a chat
    agent with a system prompt and a tool, and one of TRL's single-turn completions, each as
    ``Episode.to_dict()`` hands it to the run's sinks."""
    import examples  # noqa: F401  (the examples' datasets and tools)
    from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv
    from training import AgentTrainer
    from training.agents.spec import AgentSpec
    from training.compat.aworld.agents import Agent
    from training.config import Config
    from training.rollouts.episode_runner import EpisodeRunner
    from training.rollouts.generation import GenerationOutput
    from training.rendering import encode
    from training.rewards import load_reward
    from training.rollouts.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()

    class ScriptedGenerator:
        """Stands in for the model: answers each call with the next scripted text and EOS."""

        def __init__(self, texts: list[str]) -> None:
            self.texts = list(texts)

        async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
            ids = (encode(tokenizer, self.texts.pop(0)) + [tokenizer.eos_token_id])[:max_new_tokens]
            return GenerationOutput(text=tokenizer.decode(ids, skip_special_tokens=True), prompt_ids=list(prompt_ids),
                                    completion_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")

    config = Config.build({"rllm.agent.max_steps": 4, "rllm.agent.max_tokens_per_turn": 200,
                           "data.max_prompt_length": 4000, "data.max_response_length": 1000})

    def run(spec: AgentSpec, replies: list[str], task: dict, reward=None) -> dict:
        [episode] = EpisodeRunner(spec.validate(), ScriptedGenerator(replies), tokenizer, config, reward).run([task])
        return episode.to_dict()

    frozenlake = run(AgentSpec(agent_class=FrozenLakeAgent, env_class=FrozenLakeEnv), ["D", "R"], {"start_row": 2, "start_col": 2})
    exact = load_reward(lambda task, answer: float(answer.strip() == "5"))
    calculator = Agent(name="calculator", system_prompt=SYSTEM_PROMPT, tool_names=["examples.arithmetic.add"])
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    chat = run(calculator.to_spec(exact), [call, "5"], {"prompt": "What is 2 + 3?"}, exact)

    class Keep:
        episodes: list[dict] = []

        def log_metrics(self, step, metrics): pass
        def log_episodes(self, step, episodes): self.episodes.extend(episodes)
        def close(self): pass

    AgentTrainer(
        train_dataset=[{"prompt": "x="}, {"prompt": "y="}], reward_func=lambda task, response: 0.0, backend="trl",
        run_path=run_path, sinks=[Keep()],
        config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
                "data.max_response_length": 3, "trainer.total_training_steps": 1, "trainer.logger": []},
    ).train()
    return [frozenlake, chat, Keep.episodes[0]]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    # In a thread of its own: the rollout engine runs its own event loop, and Playwright's runs in this one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_record_episodes, str(tmp_path_factory.mktemp("single-turn"))).result()


@pytest.fixture
def site(live_platform, browser, owner, project, make_run, log_in, recorded):
    """The owner's pages, with a run whose step 1 holds the recorded episodes; the login page
    first, as a visitor sees it."""
    run = make_run(name="frozen lake with a longer name", tags=["baseline", "phone-check"])
    SeriesWriter(run.pk).write(("reward", step, step / 10) for step in range(10))
    # A second run to compare with, and the runs table as a person set it up: added columns, grouped by tag.
    other = make_run(name="a second run to compare", tags=["baseline"], config_overrides={LONG_KEY: 0.5}, model="Qwen/Qwen2.5-0.5B-Instruct")
    SeriesWriter(other.pk).write(("reward", step, step / 20) for step in range(10))
    RunTableView.objects.create(user=owner, columns=["metric:reward:max", "metric:reward:latest", f"config:{LONG_KEY}"], group="tag")
    EpisodeSample.objects.bulk_create([episode_row(run.pk, 1, position, episode) for position, episode in enumerate(recorded)])
    store_step(run.pk, None, 1, [_stored_record()])  # the token view's page, judged as the others
    url = live_platform["url"]
    page = browser.new_page()
    page.set_default_timeout(30_000)
    browser.clear_cookies()
    yield {"page": page, "url": url, "run": run, "other": other, "project": project, "episodes": recorded,
           "stored_episode": run.stored_episodes.get().pk}
    page.close()


def _stored_record() -> dict:
    """A two-turn episode of the store, its tokens' text pieces as a trainer decodes them."""
    first = [{"role": "user", "content": "Walk to the goal without falling into a hole."}]
    episode = Episode(
        trajectories=[Trajectory(steps=[
            Step(chat_completions=first, model_response="Down", reward=0.0),
            Step(chat_completions=first + [{"role": "assistant", "content": "Down"}, {"role": "user", "content": "S F\nF G"}],
                 model_response="Right", reward=1.0, done=True),
        ], reward=1.0)],
        prompt_ids=[1], response_ids=[11, 12, 21, 22, 31], response_mask=[1, 1, 0, 0, 1],
        response_logprobs=[-0.1, -0.2, 0.0, 0.0, -0.3],
    )
    record = episode_record(episode, split="train", step=1, position=0, group="g", group_position=0, advantage=0.5)
    return {**record, "token_texts": ["Down", "</s>", "S F\nF G", "\n", "Right_with_a_rather_long_token_piece"]}


def _is_run_page(site, path: str) -> bool:
    return path == f"/runs/{site['run'].pk}/"


def _pages(site) -> list[str]:
    return ["/", "/runs/new/", f"/runs/{site['run'].pk}/", "/teams/", f"/projects/{site['project'].pk}/datasets/upload/",
            f"/dashboard/compare/?runs={site['run'].pk},{site['other'].pk}",
            f"/runs/{site['run'].pk}/episodes/{site['stored_episode']}/"]


def _open(site, path: str, size: dict) -> None:
    page = site["page"]
    page.set_viewport_size(size)
    page.goto(site["url"] + path)
    page.wait_for_load_state("load")
    if path == "/":  # the column picker open, its controls judged too
        page.click("#run-columns summary")
        page.wait_for_selector("#column-config", state="visible")
    if path.startswith("/dashboard/compare/"):
        page.wait_for_selector("#param-scatter .textpoint text")
    if "/episodes/" in path:
        page.wait_for_selector("#token-view-tokens .token")


def _log_in(site, log_in) -> None:
    log_in(site["page"], site["url"], "owner", "owner-password")


def _open_episode(site, position: int) -> None:
    page = site["page"]
    _open(site, f"/runs/{site['run'].pk}/", site.get("size", DESKTOP))
    page.click(f"#dash-episode-list tbody tr:nth-child({position + 1})")
    page.wait_for_selector("#dash-episode-detail .dash-turn")


def _turns(page) -> list[list[str]]:
    """Each turn of the open episode as the lines a person reads."""
    texts = page.eval_on_selector_all("#dash-episode-detail .dash-turn", "turns => turns.map(t => t.innerText)")
    return [[line.strip() for line in text.split("\n") if line.strip()] for text in texts]


def _after(lines: list[str], label: str) -> str | None:
    """The line after the first line that starts with ``label``; None when no line does."""
    for index, line in enumerate(lines[:-1]):
        if line.startswith(label):
            return lines[index + 1]
    return None


# -- contrast --------------------------------------------------------------------------------------


CONTRAST_OF = """el => {
  const rgba = text => text.match(/[\\d.]+/g).map(Number);
  const luminance = ([r, g, b]) => {
    const [R, G, B] = [r, g, b].map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * R + 0.7152 * G + 0.0722 * B;
  };
  let background = [255, 255, 255];  // the canvas, where every box on the way is transparent
  for (let node = el; node; node = node.parentElement) {
    const c = rgba(getComputedStyle(node).backgroundColor);
    if (c.length < 4 || c[3] > 0) { background = c; break; }
  }
  const color = rgba(getComputedStyle(el).color);
  const [light, dark] = [luminance(color), luminance(background)].sort((a, b) => b - a);
  return {color: getComputedStyle(el).color, background: background.join(","), ratio: (light + 0.05) / (dark + 0.05)};
}"""


def _contrast_violations(page) -> list[str]:
    """The text on the page, as drawn, that fails axe-core's ``color-contrast`` rule (WCAG AA)."""
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page, options={"runOnly": {"type": "rule", "values": ["color-contrast"]}}).response
    judged = sum(len(rule["nodes"]) for kind in ("passes", "violations") for rule in results[kind])
    assert judged >= 5, f"axe judged the contrast of {judged} elements on {page.url}: too few to say anything"
    return [f"{node['target']}: {node['failureSummary']}" for violation in results["violations"] for node in violation["nodes"]]


def test_every_page_meets_aa_contrast(site, log_in):
    page = site["page"]
    _open(site, "/login/", DESKTOP)
    found = {"/login/": _contrast_violations(page)}
    _log_in(site, log_in)
    for path in _pages(site):
        _open(site, path, DESKTOP)
        if _is_run_page(site, path):
            for position in (FROZENLAKE, SINGLE_TURN):  # the episode viewer open, a multi-turn and a single-turn episode
                page.click(f"#dash-episode-list tbody tr:nth-child({position + 1})")
                page.wait_for_selector("#dash-episode-detail .dash-turn")
                found[f"{path} episode {position}"] = _contrast_violations(page)
        found[path] = _contrast_violations(page)
    assert not any(found.values()), {path: problems for path, problems in found.items() if problems}


def test_the_trained_text_reads_at_aa_contrast(site, log_in):
    _log_in(site, log_in)
    _open_episode(site, FROZENLAKE)
    trained = site["page"].query_selector_all("#dash-episode-detail pre.trained")
    assert len(trained) == 2  # one per turn
    for element in trained:
        seen = element.evaluate(CONTRAST_OF)
        assert seen["ratio"] >= 4.5, f"the trained text is {seen['color']} on rgb({seen['background']}): {seen['ratio']:.2f}:1"


# -- what the episode viewer shows ------------------------------------------------------------------


def test_a_multi_turn_episode_shows_the_environments_reply_to_each_turn(site, log_in):
    _log_in(site, log_in)
    _open_episode(site, FROZENLAKE)
    first, second = _turns(site["page"])
    recorded = site["episodes"][FROZENLAKE]["trajectories"][0]["steps"]

    assert _after(first, "Environment observation") == "32>", first  # not "22>", the turn's input
    assert recorded[0]["next_observation"] == "32>"
    assert _after(first, "Prompt") == "User" and first[first.index("User") + 1] == "22>"
    assert _after(first, "Model response (trained: 2 tokens)") == "D"  # "D" and EOS
    # The second turn continues the conversation: only what was added to it, then the goal.
    assert _after(second, "Added to the conversation") == "User" and "22>" not in second
    assert _after(second, "Environment observation") == "33>", second


def test_a_chat_agents_episode_shows_its_system_prompt_and_the_tool_result(site, log_in):
    _log_in(site, log_in)
    _open_episode(site, CHAT_AGENT)
    first, second = _turns(site["page"])

    assert _after(first, "Prompt") == "System prompt" and _after(first, "System prompt") == SYSTEM_PROMPT, first
    assert _after(first, "User") == "What is 2 + 3?"
    assert _after(first, "Environment observation") == "Tool result" and "5" in _after(first, "Tool result")
    assert _after(second, "Model response") == "5" and not any(line.startswith("Environment observation") for line in second)


def test_a_single_turn_episode_shows_its_prompt_and_its_trained_tokens(site, log_in):
    _log_in(site, log_in)
    _open_episode(site, SINGLE_TURN)
    page = site["page"]
    [turn] = _turns(page)
    episode = site["episodes"][SINGLE_TURN]
    tokens = len(episode["response_ids"])

    assert not any(line.startswith("Environment observation") for line in turn), turn  # the dataset row is no observation
    assert _after(turn, "Prompt") == "User" and turn[turn.index("User") + 1] == episode["task"]["prompt"], turn
    assert tokens >= 1
    facts = page.inner_text("#dash-episode-detail .dash-episode-facts")
    assert f"{tokens} response token{'s' if tokens > 1 else ''} trained" in facts, facts


def test_every_heading_stands_on_its_own_line(site, log_in):
    _log_in(site, log_in)
    _open_episode(site, FROZENLAKE)
    page = site["page"]
    for number, lines in enumerate(_turns(page), start=1):
        assert lines[0].startswith(f"Turn {number} · reward") and "Prompt" not in lines[0] and "Added" not in lines[0], lines
    # Drawn below each other, not only split in the text.
    boxes = page.eval_on_selector_all(
        "#dash-episode-detail .dash-turn",
        "turns => turns.map(t => [t.firstElementChild.getBoundingClientRect().bottom, t.children[1].getBoundingClientRect().top])")
    assert boxes and all(bottom <= top + 0.5 for bottom, top in boxes), boxes


# -- a 390 px phone -----------------------------------------------------------------------------------


PAST_THE_SCREEN = """() => {
  const width = document.documentElement.clientWidth;
  const scrolled = el => {  // inside a box that scrolls (or clips) sideways on its own
    for (let box = el.parentElement; box && box !== document.body; box = box.parentElement) {
      if (["auto", "scroll", "hidden"].includes(getComputedStyle(box).overflowX)) return true;
    }
    return false;
  };
  const out = [];
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    // (wholly left of the screen is out of sight, as Plotly's measuring box at -10000 px is)
    if ((r.width || r.height) && (r.right > width + 0.5 || (r.left < -0.5 && r.right > 0)) && !scrolled(el)) {
      out.push(el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + " " + Math.round(r.left) + ".." + Math.round(r.right));
    }
  }
  return out;
}"""

# A word (or the part of a hyphenated one up to its hyphen, where lines may end) drawn on two lines.
BROKEN_WORDS = """() => {
  const broken = [];
  for (const cell of document.querySelectorAll("th, td")) {
    if (!cell.getClientRects().length) continue;
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const word of node.textContent.matchAll(/[^\\s-]+-?/g)) {
        const range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        if (new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1) broken.push(word[0]);
      }
    }
  }
  return broken;
}"""


def test_pages_fit_a_phone_without_breaking_words(site, log_in):
    page = site["page"]
    _open(site, "/login/", PHONE)
    found = {"/login/": (page.evaluate(PAST_THE_SCREEN), page.evaluate(BROKEN_WORDS))}
    _log_in(site, log_in)
    for path in _pages(site):
        _open(site, path, PHONE)
        if _is_run_page(site, path):
            page.click("#dash-episode-list tbody tr:nth-child(1)")
            page.wait_for_selector("#dash-episode-detail .dash-turn")
        found[path] = (page.evaluate(PAST_THE_SCREEN), page.evaluate(BROKEN_WORDS))
    assert not any(wide or broken for wide, broken in found.values()), {
        path: {"past the screen": wide, "words broken in table cells": broken} for path, (wide, broken) in found.items() if wide or broken}


def test_the_menu_folds_behind_a_button_on_a_phone(site, log_in):
    page = site["page"]
    _log_in(site, log_in)
    _open(site, "/", PHONE)
    header = page.locator("header").bounding_box()
    assert header["height"] <= 0.1 * PHONE["height"], f"the header takes {header['height']:.0f} of {PHONE['height']} px"
    teams = page.locator("header nav a", has_text="Teams")
    assert not teams.is_visible()

    page.click("header button[aria-expanded=false]")
    assert page.get_attribute("header button[aria-controls]", "aria-expanded") == "true"
    assert teams.is_visible() and teams.bounding_box()["x"] + teams.bounding_box()["width"] <= PHONE["width"]
    teams.click()
    page.wait_for_url("**/teams/")

    _open(site, "/", DESKTOP)  # on a desktop the links show without a button
    assert teams.is_visible() and not page.locator("header button[aria-controls]").is_visible()
