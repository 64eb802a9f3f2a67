"""A run that explains itself, as a person sees it: the ledger's failed share of a run whose
environment raises (trained by this package's worker), a lost worker's resume marked on every chart
(a silent worker found lost by the platform's worker's liveness sweep while the page is open, the
attempts made by the run's own claims), the ledger
on a share link's page, and a monitor's alert opening its evidence."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from django.db import connection

from training.tracking.episodes import episode_record
from training.types import Episode, Step, Trajectory
from webapp.dashboard.episodes import store_step
from webapp.dashboard.series import SeriesWriter
from webapp.monitors.models import MonitorRule
from webapp.registry.models import Agent, Backend
from webapp.runs.models import Run, RunAttempt
from webapp.teams.models import ShareLink

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

RAISING_ENV = str(Path(__file__).resolve().parents[1] / "fixtures" / "raising_env.py") + ":HalfRaisingEnv"


def test_a_raising_environment_shows_its_failed_share_in_the_ledger(live_platform, browser, make_run, registry, log_in, tail):
    Backend.objects.filter(name="trl").update(queue=live_platform["queue"])
    agent = Agent.objects.create(name="cracking-lake", agent_class="examples.frozenlake.FrozenLakeAgent", env_class=RAISING_ENV)
    run = make_run(agent=agent, dataset=registry["datasets"]["frozenlake"], reward=None, config_overrides={
        "trainer.total_training_steps": 2, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2,
        "rllm.agent.max_tokens_per_turn": 1, "trainer.max_episode_error_rate": 0.9,
    })
    run.enqueue()
    page = browser.new_page()
    page.set_default_timeout(90_000)  # a loaded machine: the first page of a fresh server
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(f"{live_platform['url']}/runs/{run.pk}/")
        # The page reloads itself once the run ends (and then shows its ledger as stored).
        page.wait_for_function("() => ['succeeded', 'failed'].includes(document.getElementById('run-status').textContent)",
                               timeout=240_000)
        page.wait_for_selector("#ledger-steps-table")
        run.refresh_from_db()
        assert run.steps == 2, (run.status, run.error)
        rows = page.locator("#ledger-steps-table tbody tr")
        shown = {int(rows.nth(i).locator("td").nth(0).inner_text()): rows.nth(i).locator("td.ledger-failed").inner_text()
                 for i in range(rows.count())}
        api = {row["step"]: row for row in page.evaluate(
            f"async () => (await (await fetch('/api/runs/{run.pk}/ledger/')).json()).steps")}
        assert sorted(shown) == [1, 2] == sorted(api)
        for step, text in shown.items():
            failed, episodes = api[step]["failed"], api[step]["episodes"]
            assert 0 < failed < episodes, api[step]  # every other episode's environment raised
            assert text == f"{failed} ({round(100 * failed / episodes)}%)"
        # The one attempt: claimed by this package's worker, ended by the run's end.
        attempts = page.locator("#ledger-attempts tbody tr")
        assert attempts.count() == 1
        assert live_platform["queue"] in attempts.nth(0).inner_text()
        assert attempts.nth(0).locator("td.ledger-cause").inner_text().startswith(run.status)
        assert RunAttempt.objects.get(run=run).host  # the training process said where it ran
    except Exception:
        print(tail(live_platform["logs"] / "worker.log"))
        raise
    finally:
        page.close()


def _marks(page) -> list[dict]:
    """Per chart: the attempt labels Plotly drew (their text, shown on screen) and where its dashed lines stand."""
    return page.evaluate("""() => [...document.querySelectorAll('#dash-charts .dash-chart')].map(div => ({
        chart: div.id,
        labels: [...div.querySelectorAll('.annotation-text')].filter(t => t.getBoundingClientRect().width > 0).map(t => t.textContent),
        lines: (div._fullLayout.shapes || []).map(s => [s.x0, s.line.dash]),
    }))""")


class Heartbeats:
    """An attempt's supervisor, as far as the liveness sweep can tell: its heartbeat, twice a second, until stopped."""

    def __init__(self, run: Run) -> None:
        self.run, self.stopped = run, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        try:
            while not self.stopped.wait(0.5):
                self.run.heartbeat()
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


def test_a_lost_workers_resume_is_marked_on_every_chart_as_it_happens(live_platform, browser, make_run, owner, log_in):
    run = make_run()
    assert run.claim("first-worker")
    heartbeats = Heartbeats(run)
    SeriesWriter(run.pk, attempt=1).write((key, step, value) for step in range(1, 5)
                                          for key, value in (("reward", step / 10), ("loss", 1 / step)))
    page = browser.new_page()
    page.set_default_timeout(90_000)  # a loaded machine: the first page of a fresh server
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(f"{live_platform['url']}/runs/{run.pk}/")
        page.wait_for_selector("#dash-live.on")
        page.wait_for_function("() => document.querySelectorAll('#dash-charts .dash-chart').length >= 2")
        page.wait_for_function("() => document.querySelectorAll('#chart-reward .annotation-text').length >= 1")
        assert all(chart["labels"] == ["attempt 1"] for chart in _marks(page)), _marks(page)

        # The first worker goes silent: the platform's worker's liveness sweep finds it lost and queues the run again.
        heartbeats.stop()
        page.wait_for_function("() => [...document.querySelectorAll('#dash-charts .dash-chart')].every("
                               "div => div.querySelectorAll('.annotation-text').length === 2)", timeout=60_000)
        for chart in _marks(page):
            assert sorted(chart["labels"]) == ["attempt 1", "attempt 1: lost worker"], chart
            assert sorted(chart["lines"]) == [[0, "dash"], [4, "dot"]], chart
        run = Run.objects.get(pk=run.pk)
        assert (run.status, run.lost_attempts) == (Run.Status.QUEUED, 1)

        # Another worker resumes it and finishes: every chart marks where attempt 2 began (after step 4).
        assert run.claim("second-worker")
        SeriesWriter(run.pk, attempt=2).write((key, step, value) for step in range(5, 9)
                                              for key, value in (("reward", step / 10), ("loss", 1 / step)))
        assert run.finish(Run.Status.SUCCEEDED, steps=8)
        # The page reloads itself once the run ended: the ledger it then shows has both attempts.
        page.wait_for_function("() => document.querySelectorAll('#ledger-attempts td.ledger-cause').length === 2")
        page.wait_for_function("() => document.querySelectorAll('#dash-charts .dash-chart').length >= 2 && "
                               "[...document.querySelectorAll('#dash-charts .dash-chart')].every("
                               "div => div.querySelectorAll('.annotation-text').length === 3)")
        marks = _marks(page)
        assert len(marks) >= 2
        for chart in marks:
            assert sorted(chart["labels"]) == ["attempt 1", "attempt 1: lost worker", "attempt 2"], chart
            assert sorted(chart["lines"]) == [[0, "dash"], [4, "dash"], [4, "dot"]], chart
        causes = page.locator("#ledger-attempts tbody tr td.ledger-cause")
        assert causes.nth(0).inner_text().startswith("lost worker") and "sent no heartbeat" in causes.nth(0).inner_text()
        assert causes.nth(1).inner_text() == "succeeded"

        # A share link's page: the same ledger and the same marks.
        link = ShareLink.objects.create(run=run, created_by=owner)
        shared = browser.new_page()
        try:
            shared.goto(f"{live_platform['url']}/share/{link.token}/")
            shared.wait_for_function("() => document.querySelectorAll('#chart-reward .annotation-text').length === 3")
            ledger = shared.inner_text("#run-ledger")
            assert "lost worker" in ledger and "second-worker" in ledger and "succeeded" in ledger
        finally:
            shared.close()
    finally:
        heartbeats.stop()
        page.close()


def _episode(step: int, position: int, row: int, reward: float) -> dict:
    episode = Episode(task={"prompt": f"lake {row}"},
                      trajectories=[Trajectory(steps=[Step(chat_completions=[{"role": "user", "content": f"lake {row}"}],
                                                           model_response="R", reward=reward, done=True)], reward=reward)],
                      prompt_ids=[1], response_ids=[2], response_mask=[1])
    record = episode_record(episode, split="train", step=step, position=position, group=f"{step}-{row}", group_position=position % 2)
    record["row_index"] = row
    return record


def test_a_monitor_alert_opens_its_evidence(live_platform, browser, make_run, project, owner, log_in):
    run = make_run(project=project, visibility=Run.Visibility.TEAM)
    # Two prompts, two episodes each a step; from step 6 on each group's rewards are all equal.
    for step in range(1, 9):
        store_step(run.pk, None, step, [_episode(step, 0, 3, 1.0), _episode(step, 1, 3, 1.0 if step >= 6 else 0.0),
                                        _episode(step, 2, 4, 0.0), _episode(step, 3, 4, 0.0 if step >= 6 else 1.0)])
    MonitorRule.objects.create(project=project, monitor="all_equal_groups", threshold=0.5, window=1, created_by=owner)
    page = browser.new_page()
    page.set_default_timeout(90_000)  # a loaded machine: the first page of a fresh server
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(f"{live_platform['url']}/runs/{run.pk}/")
        alert = page.locator("#monitor-alerts li.monitor-alert")
        alert.first.wait_for()
        assert alert.count() == 1
        assert alert.inner_text().startswith("All-equal-reward groups above 0.5 at step 6")
        assert page.locator("#monitors-table tr[data-monitor=kl_spike] td").nth(1).inner_text() == "not reported"
        alert.locator("button").click()
        evidence = page.locator("#monitor-evidence")
        evidence.locator("table").wait_for()
        assert evidence.locator("h3").inner_text() == "Evidence: All-equal-reward groups at step 6"
        rows = evidence.locator("tbody tr")
        assert rows.count() == 2
        texts = {rows.nth(i).locator("td").nth(0).inner_text(): rows.nth(i) for i in range(2)}
        assert sorted(texts) == ["dataset row 3", "dataset row 4"]
        row = texts["dataset row 3"]
        now = row.locator("td.evidence-now a.evidence-episode")
        assert [now.nth(i).inner_text().split(" ·")[0] for i in range(now.count())] == ["reward 1.00", "reward 1.00"]
        earlier = row.locator("td.evidence-earlier")
        assert earlier.locator("div").inner_text() == "step 5"  # the newest step at least the rule's window (1) back
        assert sorted(earlier.locator("a").nth(i).inner_text().split(" ·")[0] for i in range(2)) == ["reward 0.00", "reward 1.00"]
        # Each episode opens token by token.
        now.first.click()
        page.wait_for_url(f"**/runs/{run.pk}/episodes/*/")
    finally:
        page.close()
