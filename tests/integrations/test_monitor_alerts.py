"""A project's monitor rule that a run crosses is delivered through the project's alert rules: the
workers' housekeeping (``alerts.tick``) reads the monitors of runs with new metric points and adds
one alert per monitor rule and run to the outbox, sent like every other alert."""

from __future__ import annotations

import pytest
from django.utils import timezone

from webapp.dashboard.series import SeriesWriter
from webapp.integrations import alerts
from webapp.integrations.models import AlertDelivery
from webapp.monitors import health
from webapp.monitors.models import Monitor, MonitorRule
from webapp.runs.models import Run
from webapp.teams.models import Membership, Project, Team

RULES = "/api/monitor-rules/"


@pytest.fixture
def spiking_run(make_run, project):
    """A running team-visible run whose stored KL jumps twentyfold at step 15 of 20."""
    run = make_run(project=project, visibility=Run.Visibility.TEAM, name="lake")
    assert run.claim("test-worker")
    SeriesWriter(run.pk).write(("kl", step, 0.2 if step == 15 else 0.01) for step in range(1, 21))
    Run.objects.filter(pk=run.pk).update(steps=20, metrics_at=timezone.now())
    return Run.objects.get(pk=run.pk)


def kl_rule(project, alert=None) -> MonitorRule:
    return MonitorRule.objects.create(project=project, monitor=Monitor.KL_SPIKE, threshold=5.0, window=5, alert=alert)


def test_a_crossed_rule_is_delivered_once_to_its_alerts_webhook(spiking_run, project, project_rule, receiver, settings):
    settings.PLATFORM_URL = "https://rl.example.org"
    hook = project_rule(receiver.target, ["failed"])
    rule = kl_rule(project, alert=hook)

    alerts.tick()
    alerts.tick()

    delivery = AlertDelivery.objects.get()
    assert (delivery.rule, delivery.run, delivery.event, delivery.status) == (hook, spiking_run, f"monitor:{rule.pk}@15", "sent")
    assert len(receiver.bodies) == 1
    message = receiver.bodies[0]["message"]
    assert "KL spike > 5 (over 5 step(s), read from metric kl): 20 at step 15." in message
    assert f"https://rl.example.org/api/runs/{spiking_run.pk}/monitors/evidence/?step=15&window=5" in message
    assert health.report(spiking_run)["rules"][0]["delivered"] is True


def test_a_run_with_no_new_metric_point_is_not_read_again(spiking_run, project, project_rule, receiver, monkeypatch):
    kl_rule(project, alert=project_rule(receiver.target, ["failed"]))
    assert alerts.find_monitor_crossings() == 1
    read = []
    monkeypatch.setattr(health, "RunData", lambda run: read.append(run.pk))
    assert alerts.find_monitor_crossings() == 0 and read == []
    Run.objects.filter(pk=spiking_run.pk).update(metrics_at=timezone.now())  # a new point: read again
    # Read again (the stand-in is no RunData: the check logs that and carries on, never raising).
    assert alerts.find_monitor_crossings() == 0 and read == [spiking_run.pk]


def test_a_rule_without_an_alert_is_shown_on_the_run_page_only(spiking_run, project, project_rule, receiver):
    project_rule(receiver.target, ["failed"])  # the project has an alert rule; the monitor rule names none
    kl_rule(project)
    alerts.tick()
    assert not AlertDelivery.objects.exists() and receiver.bodies == []
    report = health.report(spiking_run)  # the run page still shows the crossing, and says it goes nowhere
    assert [alert["step"] for alert in report["alerts"]] == [15] and report["rules"][0]["delivered"] is False


def test_the_webhook_is_sent_through_the_egress_guard(spiking_run, project, project_rule, receiver, settings):
    kl_rule(project, alert=project_rule(receiver.target, ["failed"]))
    settings.EGRESS_ALLOWED_HOSTS = ()  # the receiver's loopback address is no longer allowed
    alerts.tick()
    delivery = AlertDelivery.objects.get()
    assert delivery.status == "pending" and delivery.attempts == 1 and receiver.bodies == []
    assert "attempt 1:" in delivery.last_error


@pytest.fixture
def theirs(stranger):
    """The stranger owns a team and project of their own."""
    elsewhere = Team.objects.create(name="Other team", slug="other")
    Membership.objects.create(team=elsewhere, user=stranger, role=Membership.Role.OWNER)
    return Project.objects.create(team=elsewhere, name="other")


def test_another_teams_owner_cannot_alert_a_projects_target_through_the_api(
        theirs, stranger, project_rule, receiver, api_client):
    ours = project_rule(receiver.target, ["failed"])
    response = api_client(stranger).post(RULES, {"project": theirs.pk, "monitor": "kl_spike", "threshold": 5, "alert": ours.pk},
                                         format="json")
    assert response.status_code == 400, response.content
    assert response.json()["alert"] == ["No such alert rule in this project."]
    # A rule that does not exist reads the same.
    response = api_client(stranger).post(RULES, {"project": theirs.pk, "monitor": "kl_spike", "threshold": 5, "alert": ours.pk + 1000},
                                         format="json")
    assert response.json()["alert"] == ["No such alert rule in this project."]
    assert not MonitorRule.objects.exists()


def test_the_api_sets_an_alert_of_the_rules_own_project(project, owner, project_rule, receiver, api_client):
    hook = project_rule(receiver.target, ["failed"])
    response = api_client(owner).post(RULES, {"project": project.pk, "monitor": "kl_spike", "threshold": 5, "alert": hook.pk},
                                      format="json")
    assert response.status_code == 201, response.content
    assert MonitorRule.objects.get().alert == hook and response.json()["alert"] == hook.pk


def test_the_form_offers_only_the_projects_own_alert_rules(theirs, stranger, project_rule, receiver, client):
    ours = project_rule(receiver.target, ["failed"])
    client.force_login(stranger)
    response = client.post(f"/projects/{theirs.pk}/integrations/monitors/",
                           {"monitor": "kl_spike", "threshold": 5, "window": 5, "alert": ours.pk})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not MonitorRule.objects.exists()
