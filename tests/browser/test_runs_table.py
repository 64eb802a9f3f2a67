"""The runs table as a person uses it: add a metric column (its best value) and a config column,
read the values in the rows, sort by clicking a heading, reload (another browser: the view is kept
on the server), group by tag. And the compare page: the agent, dataset, reward and model in the
config diff, and the scatter's points named by their run where they are drawn."""

from __future__ import annotations

import pytest

from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LR = "actor_rollout_ref.actor.optim.lr"


@pytest.fixture
def runs(make_run):
    """Three runs whose best reward and latest reward order them differently, each with a learning rate."""
    made = {}
    for name, rewards, lr, tags in (("peaked", [0.1, 0.9, 0.2], 0.01, ["baseline"]), ("steady", [0.3, 0.4, 0.5], 0.001, ["baseline"]),
                                    ("late", [0.0, 0.1, 0.6], 0.1, ["tuned"])):
        run = make_run(name=name, status=Run.Status.SUCCEEDED, config_overrides={LR: lr}, tags=tags)
        SeriesWriter(run.pk).write(("reward", step, value) for step, value in enumerate(rewards, start=1))
        made[name] = run.pk
    return made


def _table(page) -> list[list[str]]:
    """The rows a person sees: the run's name and the added columns' cells."""
    return page.eval_on_selector_all("#run-table tbody tr[data-run]", """rows => rows.map(tr => [
        tr.querySelector("td:nth-child(2) a").innerText.replace(/^#\\d+ /, ""),
        ...[...tr.querySelectorAll("td.number")].map(td => td.innerText)])""")


def test_a_person_adds_columns_sorts_reloads_and_groups(live_platform, browser, runs, log_in):
    page = browser.new_page()
    page.set_default_timeout(30_000)
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(live_platform["url"] + "/")
        page.select_option("#column-metric", "reward")
        page.select_option("#column-aggregate", "max")
        page.click("#add-metric-column button[type=submit]")
        page.wait_for_selector("#run-table th[data-column='metric:reward:max']")
        page.click("#run-columns summary")
        page.select_option("#column-config", LR)
        page.click("#add-config-column button[type=submit]")
        page.wait_for_selector(f"#run-table th[data-column='config:{LR}']")
        assert page.inner_text(f"#run-table th[data-column='config:{LR}']") == LR
        assert sorted(_table(page)) == [["late", "0.6", "0.1"], ["peaked", "0.9", "0.01"], ["steady", "0.5", "0.001"]]

        page.click("#run-table th[data-column='metric:reward:max'] a")  # the best first
        page.wait_for_selector("#run-table th[data-column='metric:reward:max'][aria-sort=descending]")
        assert [row[0] for row in _table(page)] == ["peaked", "late", "steady"]
        assert page.inner_text("#run-table th[data-column='metric:reward:max']") == "reward (highest) ▼"
        page.click("#run-table th[data-column='metric:reward:max'] a")
        page.wait_for_selector("#run-table th[data-column='metric:reward:max'][aria-sort=ascending]")
        assert [row[0] for row in _table(page)] == ["steady", "late", "peaked"]

        browser.clear_cookies()  # another browser, the same person: the view comes from the server
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(live_platform["url"] + "/")
        assert page.get_attribute("#run-table th[data-column='metric:reward:max']", "aria-sort") == "ascending"
        assert [row[0] for row in _table(page)] == ["steady", "late", "peaked"]
        assert page.locator(f"#run-table th[data-column='config:{LR}']").is_visible()

        page.select_option("#run-group", "tag")
        page.click("#run-filter button[type=submit]")
        page.wait_for_selector("#run-table tr.group-head")
        heads = page.eval_on_selector_all("#run-table tr.group-head", "rows => rows.map(tr => tr.innerText.split('\\t').map(s => s.trim()).filter(Boolean))")
        assert heads == [["tag: baseline · 2 runs", "mean 0.7"], ["tag: tuned · 1 run", "mean 0.6"]]
        assert [row[0] for row in _table(page)] == ["steady", "peaked", "late"]  # sorted within each group
        page.reload()
        assert page.locator("#run-table tr.group-head").count() == 2
    finally:
        page.close()


def test_compare_shows_the_choices_that_differ_and_names_each_scatter_point(live_platform, browser, make_run, registry, log_in):
    copy = make_run(name="copy run", status=Run.Status.SUCCEEDED, config_overrides={LR: 0.01}, final_metrics={"reward": 0.4})
    lake = make_run(name="lake run", status=Run.Status.SUCCEEDED, agent=registry["agents"]["frozenlake"],
                    dataset=registry["datasets"]["frozenlake"], reward=None, model="Qwen/Qwen2.5-0.5B-Instruct",
                    config_overrides={LR: 0.001}, final_metrics={"reward": 0.7})
    page = browser.new_page()
    page.set_default_timeout(60_000)
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(f"{live_platform['url']}/dashboard/compare/?runs={copy.pk},{lake.pk}")
        rows = page.eval_on_selector_all("#compare-params tbody tr", "rows => rows.map(tr => tr.innerText.split('\\t').map(s => s.trim()))")
        assert rows[:4] == [["agent", "copy-task", "frozenlake"], ["dataset", "copy", "frozenlake"],
                            ["reward", "char-accuracy", "—"], ["model", "tiny-char", "Qwen/Qwen2.5-0.5B-Instruct"]]
        assert [LR, "0.01", "0.001"] in rows

        page.select_option("#param-key", LR)
        page.wait_for_function("() => document.querySelectorAll('#param-scatter .textpoint text').length === 2")
        names = {f"#{copy.pk} copy run", f"#{lake.pk} lake run"}
        assert set(page.evaluate("document.getElementById('param-scatter').data[0].text")) == names
        drawn = page.eval_on_selector_all("#param-scatter .textpoint text", "nodes => nodes.map(n => n.textContent)")
        assert set(drawn) == names  # written beside the points, not only on hover
    finally:
        page.close()
