"""What a person debugging a run sees of its episodes on the run page: the list filtered by reward and
termination (the address keeps the filter, a reload shows the same list), a bar of one step's reward
histogram opening exactly its episodes, a group's episodes side by side with their rewards and
advantages, one dataset row's prompt at each step it was sampled, a point of the reward chart and of
the validation chart opening that step's episodes, and the token view of an episode whose
conversation does not tokenize back to the ids trained on (the drift flag and the token where it
drifts, beside the trained and untrained tokens). Plotly's charts are clicked with the mouse where
Plotly drew the bar or the point."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

from training.tracking.episodes import episode_record
from training.types import Episode, Step, TerminationReason, Trajectory
from webapp.dashboard.episodes import store_step
from webapp.dashboard.series import SeriesWriter

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROWS = "#stored-episodes-list tbody tr"
# Rewards of each step's 8 episodes (two groups of 4 prompts, dataset rows 0-3 twice).
REWARDS = {1: [0.0, 0.0, 0.0, 1.0, 0.0, 0.25, 0.5, 0.5],
           2: [0.0, 0.5, 0.5, 1.0, 0.25, 0.25, 0.75, 1.0],
           3: [0.0, 0.5, 1.0, 1.0, 0.75, 0.75, 1.0, 1.0]}
# Where Plotly drew a point of ``trace``'s data (x, y) on the page, for the mouse.
WHERE = """([selector, x, y]) => {
    const div = document.querySelector(selector);
    const box = div.querySelector('.nsewdrag').getBoundingClientRect();
    return [box.left + div._fullLayout.xaxis.l2p(x), box.top + div._fullLayout.yaxis.l2p(y)];
}"""


def record(step: int, position: int, *, split: str = "train", drift: bool = False) -> dict:
    reward = REWARDS[step][position] if split == "train" else 0.5
    rewards = REWARDS[step][position // 4 * 4:position // 4 * 4 + 4]
    replies = ["call add", "the answer is 5"]
    episode = Episode(
        task={"data_source": "math"},
        trajectories=[Trajectory(steps=[
            Step(chat_completions=[{"role": "user", "content": f"prompt of row {position % 4}"}], model_response=replies[0]),
            Step(chat_completions=[{"role": "user", "content": f"prompt of row {position % 4}"},
                                   {"role": "assistant", "content": replies[0]}, {"role": "tool", "content": "5"}],
                 model_response=f"{replies[1]} (step {step}, #{position})", reward=reward, done=True),
        ], reward=reward)],
        prompt_ids=[1, 2], response_ids=[11, 12, 21, 22, 31, 32], response_mask=[1, 1, 0, 0, 1, 1],
        termination_reason=TerminationReason.MAX_TURNS if position == 7 else TerminationReason.ENV_DONE,
    )
    episode.info["retokenization"] = {"drift": drift, "position": 6 if drift else None}
    return episode_record(episode, split=split, step=step, position=position, group=f"group-{step}-{position // 4}",
                          group_position=position % 4, row_index=position % 4,
                          advantage=round(reward - sum(rewards) / 4, 4))


@pytest.fixture
def debugged_run(make_run):
    """A run of 3 steps of 8 episodes (the last one of step 3 drifts), validation at step 2, and the
    reward and validation charts' points."""
    run = make_run()
    for step in (1, 2, 3):
        store_step(run.pk, None, step, [record(step, p, drift=(step, p) == (3, 6)) for p in range(8)]
                   + ([record(step, 0, split="val")] if step == 2 else []))
    SeriesWriter(run.pk).write([("reward", step, sum(REWARDS[step]) / 8) for step in (1, 2, 3)] + [("val/score", 2, 0.5)])
    return run


@pytest.fixture
def run_page(debugged_run, live_platform, browser, log_in, tail):
    page = browser.new_page()
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    page.set_default_navigation_timeout(90_000)  # the first page of a cold server on a busy machine
    log_in(page, live_platform["url"], "owner", "owner-password")
    try:
        yield page
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        raise
    finally:
        page.close()


def shown(page) -> list[tuple[str, ...]]:
    """(step, group, reward, termination, row, advantage, retokenization) of each listed episode."""
    cells = [[td.text_content() for td in row.query_selector_all("td")] for row in page.query_selector_all(ROWS)]
    return [(c[2], c[3], c[4], c[5], c[7], c[8], c[9]) for c in cells]


def wait_for_rows(page, count: int) -> None:
    page.wait_for_function(f"() => document.querySelectorAll('{ROWS}').length === {count} && "
                           f"document.getElementById('stored-episodes-note').textContent.startsWith('{count} shown')")


def wait_for_column(page, index: int, values: list[str]) -> None:
    """Until the listed episodes' column ``index`` reads ``values``, top to bottom."""
    page.wait_for_function("([rows, index, values]) => JSON.stringify([...document.querySelectorAll(rows)]"
                           ".map(r => r.cells[index].textContent)) === JSON.stringify(values)", arg=[ROWS, index, values])


def query_of(page) -> dict[str, list[str]]:
    return parse_qs(urlparse(page.url).query)


def click_at(page, selector: str, x: float, y: float) -> None:
    """The mouse moved onto, then clicking, what Plotly drew at (x, y) of the chart ``selector``."""
    page.eval_on_selector(selector, "div => div.scrollIntoView({block: 'center'})")
    left, top = page.evaluate(WHERE, [selector, x, y])
    page.mouse.move(left, top)
    page.mouse.click(left, top)


def test_filter_by_reward_and_termination_then_open_a_histogram_bar(run_page, debugged_run, live_platform):
    page = run_page
    page.goto(f"{live_platform['url']}/runs/{debugged_run.pk}/")
    wait_for_rows(page, 25)

    page.fill("#stored-episodes-filter input[name=reward_min]", "0.75")
    page.select_option("#stored-episodes-filter select[name=termination]", "max_turns")
    page.click("#stored-episodes-filter button[type=submit]")
    wait_for_rows(page, 2)
    assert [(s[0], s[2], s[3]) for s in shown(page)] == [("2", "1", "max_turns"), ("3", "1", "max_turns")]
    assert query_of(page) == {"reward_min": ["0.75"], "termination": ["max_turns"]}
    page.reload()  # the address keeps the filter
    wait_for_rows(page, 2)
    assert page.input_value("#stored-episodes-filter input[name=reward_min]") == "0.75"

    # The histogram opens at the last step: step 3's rewards in 20 bins from 0 to 1.
    page.wait_for_function("() => document.getElementById('episode-histogram-title').textContent === 'Rewards of step 3 (train)'")
    assert page.text_content("#episode-histogram-note").startswith("8 episodes")
    bins = [b.text_content() for b in page.query_selector_all("#episode-histogram-bins li")]
    assert bins == ["0.000 – 0.050: 1", "0.500 – 0.550: 1", "0.750 – 0.800: 2", "0.950 – 1.000: 4"]
    click_at(page, "#episode-histogram-chart", 0.775, 1)  # the bar of the two rewards of 0.75
    wait_for_column(page, 4, ["0.750", "0.750"])
    assert [(s[0], s[2]) for s in shown(page)] == [("3", "0.750"), ("3", "0.750")]
    assert query_of(page) == {"split": ["train"], "step_min": ["3"], "step_max": ["3"], "reward_min": ["0.75"],
                              "reward_max": ["0.75"]}
    assert page.input_value("#stored-episodes-filter select[name=termination]") == ""  # the bar's episodes, all of them
    page.go_back()  # the filter before the bar
    wait_for_column(page, 5, ["max_turns", "max_turns"])
    assert page.input_value("#stored-episodes-filter select[name=termination]") == "max_turns"

    # Another step's histogram; its bar of the four rewards of 0 opens them.
    page.fill("#episode-histogram-form input[name=step]", "1")
    page.click("#episode-histogram-form button[type=submit]")
    page.wait_for_function("() => document.getElementById('episode-histogram-title').textContent === 'Rewards of step 1 (train)'")
    page.click("#episode-histogram-bins a:text-is('0.000 – 0.050: 4')")
    wait_for_rows(page, 4)
    assert {s[2] for s in shown(page)} == {"0"} and {s[0] for s in shown(page)} == {"1"}


def test_a_group_side_by_side_and_one_prompt_across_training(run_page, debugged_run, live_platform):
    page = run_page
    page.goto(f"{live_platform['url']}/runs/{debugged_run.pk}/?step_min=2&step_max=2&split=train")
    wait_for_rows(page, 8)
    assert page.is_hidden("#episode-group") and page.is_hidden("#episode-prompt")

    page.click(f"{ROWS}:nth-child(5) a.open-group")  # step 2's second group
    wait_for_rows(page, 4)
    assert query_of(page) == {"group": ["group-2-1"], "split": ["train"]}
    page.wait_for_function("() => document.getElementById('episode-group-title').textContent === 'Group group-2-1 · step 2'")
    assert page.text_content("#episode-group-summary").startswith("4 episodes of one prompt · mean reward 0.563")
    cards = page.query_selector_all("#episode-group-cards .episode-card")
    facts = [dict(zip([d.text_content() for d in c.query_selector_all("dt")], [d.text_content() for d in c.query_selector_all("dd")]))
             for c in cards]
    assert [(f["Reward"], f["Advantage"]) for f in facts] == [
        ("0.250", "-0.313"), ("0.250", "-0.313"), ("0.750", "0.188"), ("1", "0.438")]
    page.wait_for_function("() => [...document.querySelectorAll('#episode-group-cards .episode-reply')]"
                           ".every(p => p.textContent.startsWith('the answer is 5'))")
    assert cards[3].query_selector(".episode-reply").text_content() == "the answer is 5 (step 2, #7)"
    assert "best" in cards[3].get_attribute("class") and "worst" in cards[0].get_attribute("class")

    page.click(f"{ROWS}:nth-child(2) a.open-row")  # the group's second episode: dataset row 1
    wait_for_rows(page, 6)
    assert query_of(page) == {"row_index": ["1"], "split": ["train"]}
    page.wait_for_function("() => document.getElementById('episode-prompt-title').textContent === "
                           "'Dataset row 1 across training: 6 episodes'")
    assert page.is_hidden("#episode-group") and page.is_visible("#episode-prompt")
    steps = [[td.text_content() for td in tr.query_selector_all("td")]
             for tr in page.query_selector_all("#episode-prompt-steps tbody tr")]
    assert steps == [["1", "2", "0.125", "0 0.250"], ["2", "2", "0.375", "0.500 0.250"], ["3", "2", "0.625", "0.500 0.750"]]
    page.wait_for_function("() => document.getElementById('episode-prompt-text').textContent === 'user: prompt of row 1'")


def test_a_point_of_a_chart_opens_its_steps_episodes(run_page, debugged_run, live_platform):
    page = run_page
    page.goto(f"{live_platform['url']}/runs/{debugged_run.pk}/")
    wait_for_rows(page, 25)
    page.wait_for_function("() => Number((document.querySelector(\".dash-chart[data-key='reward']\") || {dataset: {}}).dataset.points) === 3")
    click_at(page, ".dash-chart[data-key='reward']", 2, sum(REWARDS[2]) / 8)
    wait_for_rows(page, 8)
    assert {s[0] for s in shown(page)} == {"2"}
    assert query_of(page) == {"split": ["train"], "step_min": ["2"], "step_max": ["2"]}

    page.wait_for_function("() => Number((document.querySelector(\".dash-chart[data-key='val/']\") || {dataset: {}}).dataset.points) === 1")
    click_at(page, ".dash-chart[data-key='val/']", 2, 0.5)
    wait_for_rows(page, 1)
    assert query_of(page) == {"split": ["val"], "step_min": ["2"], "step_max": ["2"]}


def test_the_token_view_flags_retokenization_drift(run_page, debugged_run, live_platform):
    page = run_page
    page.goto(f"{live_platform['url']}/runs/{debugged_run.pk}/?drift=true")
    wait_for_rows(page, 1)
    assert shown(page) == [("3", "group-3-", "1", "env_done", "2", "0.125", "drifts at 6")]
    assert page.is_visible(f"{ROWS} .drift-flag")
    page.click(f"{ROWS} td:nth-child(2)")
    page.wait_for_selector("#token-view-tokens .token")
    assert page.is_visible("#token-view-drift")
    assert "does not give back the token ids that were generated" in page.text_content("#token-view-drift")
    trained = [t.text_content() for t in page.query_selector_all("#token-view-tokens .token.trained")]
    untrained = [t.text_content() for t in page.query_selector_all("#token-view-tokens .token.untrained")]
    assert (trained, untrained) == (["11", "12", "31", "32"], ["21", "22"])
    assert [t.text_content() for t in page.query_selector_all("#token-view-tokens .token.drift")] == ["31"]
    colour = "el => getComputedStyle(el).outlineColor"
    assert page.eval_on_selector("#token-view-tokens .token.drift", colour) != \
        page.eval_on_selector("#token-view-tokens .token:not(.drift)", colour)
    facts = page.text_content("#token-view-facts")
    assert "drifts at response token 4" in facts

    # An episode that renders back says so, with no flag.
    other = debugged_run.stored_episodes.get(step=3, position=5, split="train")
    page.goto(f"{live_platform['url']}/runs/{debugged_run.pk}/episodes/{other.pk}/")
    page.wait_for_selector("#token-view-tokens .token")
    assert page.is_hidden("#token-view-drift") and not page.query_selector_all("#token-view-tokens .token.drift")
    assert "renders the conversation back to the same token ids" in page.text_content("#token-view-facts")
