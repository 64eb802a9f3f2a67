"""What a person sees of the episode store on the run page: every stored episode listed, the
filters narrowing the list, a bad filter's reason in words, and the export links carrying them."""

from __future__ import annotations

import pytest

from training.tracking.episodes import episode_record
from training.types import Episode, Step, TerminationReason, Trajectory
from webapp.dashboard.episodes import store_step

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def record(step: int, position: int) -> dict:
    failed = position == 3
    episode = Episode(
        task={"data_source": "math" if position % 2 else "copy"},
        trajectories=[Trajectory(steps=[Step(chat_completions=[{"role": "user", "content": f"task {step}.{position}"}],
                                             model_response="ok", reward=position / 4, done=True)], reward=position / 4)],
        prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 1],
        termination_reason=TerminationReason.ERROR if failed else TerminationReason.ENV_DONE,
    )
    return episode_record(episode, split="train", step=step, position=position, group=f"group{step}{position // 2}",
                          group_position=position % 2)


def test_the_run_page_lists_every_episode_and_filters_them(live_platform, browser, make_run, log_in, tail):
    run = make_run()
    for step in (1, 2, 3):
        store_step(run.pk, None, step, [record(step, p) for p in range(4)])
    page = browser.new_page()
    page.set_default_timeout(30_000)
    rows = "#stored-episodes-list tbody tr"
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(f"{live_platform['url']}/runs/{run.pk}/")
        page.wait_for_function(f"() => document.querySelectorAll('{rows}').length === 12")
        assert page.text_content("#stored-episodes-note") == "12 shown"

        page.select_option("#stored-episodes-filter select[name=termination]", "error")
        page.fill("#stored-episodes-filter input[name=step_min]", "2")
        page.click("#stored-episodes-filter button[type=submit]")
        page.wait_for_function(f"() => document.querySelectorAll('{rows}').length === 2")
        cells = [[td.text_content() for td in row.query_selector_all("td")] for row in page.query_selector_all(rows)]
        assert [(c[2], c[4], c[5], c[6]) for c in cells] == [("2", "0.750", "error", "math"), ("3", "0.750", "error", "math")]
        assert "termination=error" in page.get_attribute("#stored-episodes-parquet", "href")

        page.fill("#stored-episodes-filter input[name=step_max]", "1")  # above step_min: refused, said in words
        page.click("#stored-episodes-filter button[type=submit]")
        page.wait_for_function("() => document.getElementById('stored-episodes-note').textContent.startsWith('step_min')")
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        raise
    finally:
        page.close()
