"""A monitor rule alerts on every crossing of its threshold, not only a run's first: a monitor that
falls back under the threshold and crosses it again is told again, each crossing exactly once
however many sweeps read it, at most ``MONITOR_ALERTS_PER_RUN`` per rule and run. The sweep also
reads runs that ended long before any sweep saw them (workers down), but never alerts for a run that
ended before the rule was made. Real rows: the metric store's points, the outbox, the rules."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.apps import apps
from django.utils import timezone

from webapp.dashboard.series import SeriesWriter
from webapp.integrations import alerts
from webapp.integrations.models import AlertDelivery
from webapp.monitors import health
from webapp.monitors.models import Monitor, MonitorCheck, MonitorRule
from webapp.runs.models import Run


def log_kl(run: Run, steps: range, spikes: set[int]) -> Run:
    """Store KL points of ``steps`` (0.01, twenty times that at ``spikes``) as the run logs them."""
    SeriesWriter(run.pk).write(("kl", step, 0.2 if step in spikes else 0.01) for step in steps)
    Run.objects.filter(pk=run.pk).update(steps=steps[-1], metrics_at=timezone.now())
    return Run.objects.get(pk=run.pk)


@pytest.fixture
def team_run(make_run, project):
    def make(**fields) -> Run:
        return make_run(project=project, visibility=Run.Visibility.TEAM, **fields)
    return make


@pytest.fixture
def kl_rule(project, project_rule, receiver):
    hook = project_rule(receiver.target, ["failed"])
    return MonitorRule.objects.create(project=project, monitor=Monitor.KL_SPIKE, threshold=5.0, window=5, alert=hook)


def told_steps(run: Run) -> list[int]:
    return sorted(int(event.split("@")[1]) for event in AlertDelivery.objects.filter(run=run).values_list("event", flat=True))


def test_a_second_crossing_after_falling_back_is_told_too(team_run, kl_rule, receiver):
    run = team_run()
    assert run.claim("test-worker")
    run = log_kl(run, range(1, 21), spikes={15})
    alerts.tick()
    assert told_steps(run) == [15]
    log_kl(run, range(21, 41), spikes={30})  # back under the threshold after 15, above again at 30
    alerts.tick()
    alerts.tick()
    assert told_steps(run) == [15, 30]
    assert len(receiver.bodies) == 2 and "at step 30." in receiver.bodies[1]["message"]


def test_each_crossing_is_told_once_however_many_sweeps_read_it(team_run, kl_rule):
    run = team_run()
    assert run.claim("test-worker")
    run = log_kl(run, range(1, 41), spikes={15, 30})
    assert alerts.check_monitors(run) == 2
    assert alerts.check_monitors(run) == 0  # another worker's sweep reading the same points
    assert told_steps(run) == [15, 30]


def test_a_rule_tells_one_run_at_most_its_bound(team_run, kl_rule):
    run = team_run()
    assert run.claim("test-worker")
    spikes = set(range(10, 10 * (alerts.MONITOR_ALERTS_PER_RUN + 4), 10))  # more crossings than the bound
    run = log_kl(run, range(1, 10 * (alerts.MONITOR_ALERTS_PER_RUN + 4)), spikes=spikes)
    alerts.check_monitors(run)
    alerts.check_monitors(run)
    assert told_steps(run) == sorted(spikes)[:alerts.MONITOR_ALERTS_PER_RUN]


def test_a_run_that_ended_while_no_sweep_ran_is_still_read(team_run, kl_rule):
    """It ended three hours ago, after the rule was made; no worker swept since it logged."""
    run = log_kl(team_run(status=Run.Status.FAILED), range(1, 21), spikes={15})
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(hours=3))
    MonitorRule.objects.filter(pk=kl_rule.pk).update(created_at=timezone.now() - timedelta(days=1))
    assert alerts.find_monitor_crossings() == 1
    assert told_steps(run) == [15]
    assert alerts.find_monitor_crossings() == 0  # read: not again until it logs more


def test_a_run_that_ended_before_the_rule_was_made_is_not_alerted(team_run, kl_rule):
    run = log_kl(team_run(status=Run.Status.SUCCEEDED), range(1, 21), spikes={15})
    Run.objects.filter(pk=run.pk).update(finished_at=kl_rule.created_at - timedelta(minutes=1))
    run.refresh_from_db()
    assert alerts.monitor_runs() == []
    assert alerts.check_monitors(run) == 0 and not AlertDelivery.objects.exists()


def test_the_old_runs_are_read_a_few_a_sweep_the_newest_first(team_run, kl_rule):
    MonitorRule.objects.filter(pk=kl_rule.pk).update(created_at=timezone.now() - timedelta(days=1))
    ended = []
    for hours in (5, 3, 4):
        run = log_kl(team_run(status=Run.Status.FAILED), range(1, 21), spikes={15})
        Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(hours=hours),
                                             metrics_at=timezone.now() - timedelta(hours=hours))
        ended.append(run)
    live = team_run()
    assert live.claim("test-worker")
    live = log_kl(live, range(1, 21), spikes=set())
    assert [run.pk for run in alerts.monitor_runs(limit=5, backlog=2)] == [live.pk, ended[1].pk, ended[2].pk]
    for run in alerts.monitor_runs(limit=5, backlog=2):
        MonitorCheck.objects.update_or_create(run=run, defaults={"metrics_at": run.metrics_at})
    assert [run.pk for run in alerts.monitor_runs(limit=5, backlog=2)] == [ended[0].pk]


def test_the_deliveries_of_the_earlier_version_name_their_crossings_step(team_run, kl_rule):
    """The migration gives a delivery of ``monitor:<rule>`` the step of its title: not told again."""
    run = team_run()
    assert run.claim("test-worker")
    run = log_kl(run, range(1, 41), spikes={15, 30})
    AlertDelivery.objects.create(rule=kl_rule.alert, run=run, event=f"monitor:{kl_rule.pk}",
                                 title=f"[monitor] run #{run.pk}: KL spike 20 at step 15", body="...")
    migration = importlib.import_module("webapp.integrations.migrations.0002_alertdelivery_monitor_crossing_events")
    migration.name_the_crossing_step(apps, None)
    assert alerts.check_monitors(run) == 1
    assert told_steps(run) == [15, 30]
    migration.keep_the_first_crossing(apps, None)  # the way back: one per rule and run, the first
    assert list(AlertDelivery.objects.values_list("event", flat=True)) == [f"monitor:{kl_rule.pk}"]


def test_a_stretch_cut_by_the_edge_of_the_steps_read_is_not_a_new_crossing(team_run, kl_rule):
    """Once a run has more steps than the monitors read, the first step read moves on with each sweep:
    a stretch above the threshold that began before it (told when it was read whole) is not told again."""
    run = team_run()
    assert run.claim("test-worker")
    rising = {step: 0.01 * 10 ** (step - 99) for step in range(100, 111)}  # each step ten times the last: all spikes
    SeriesWriter(run.pk).write(("kl", step, rising.get(step, 0.01)) for step in range(1, 301))
    Run.objects.filter(pk=run.pk).update(steps=300, metrics_at=timezone.now())
    assert alerts.check_monitors(Run.objects.get(pk=run.pk)) == 1
    assert told_steps(run) == [100]
    high = 100 + health.MAX_MONITOR_STEPS  # the steps read start at 101: the stretch of 100..110 is cut
    SeriesWriter(run.pk).write(("kl", step, 0.01) for step in range(301, high + 1))
    Run.objects.filter(pk=run.pk).update(steps=high, metrics_at=timezone.now())
    assert alerts.check_monitors(Run.objects.get(pk=run.pk)) == 0
    assert told_steps(run) == [100]
