"""Alerts against a local HTTP receiver (apprise's json://) and Django's locmem mail outbox:
one message per event, retried after the receiver answers 500, none lost."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from webapp.integrations.alerts import ThresholdSink, deliver_due, find_quiet_runs
from webapp.integrations.models import AlertDelivery, AlertRule


def running(make_run, **fields):
    run = make_run(**fields)
    assert run.claim("test-worker")
    return run


def test_a_failed_run_is_posted_once_and_retried_after_a_500(receiver, project_rule, make_run, project):
    rule = project_rule(receiver.target, ["failed"])
    run = running(make_run, project=project, name="lake", visibility="team")
    run.finish("failed", error="ValueError: reward raised at row 3")
    assert not run.finish("failed", error="again")  # a second end changes nothing and tells nobody

    receiver.statuses = [500]
    assert deliver_due() == {"sent": 0, "retry": 1, "failed": 0}
    delivery = AlertDelivery.objects.get(rule=rule, run=run)
    assert delivery.status == "pending" and delivery.attempts == 1 and "attempt 1" in delivery.last_error
    assert deliver_due() == {"sent": 0, "retry": 0, "failed": 0}  # not due yet: backoff

    assert deliver_due(now=timezone.now() + timedelta(hours=2)) == {"sent": 1, "retry": 0, "failed": 0}
    delivery.refresh_from_db()
    assert delivery.status == "sent" and delivery.attempts == 2
    assert len(receiver.bodies) == 2  # the refused one and the delivered one, nothing more
    body = receiver.bodies[-1]
    assert body["title"] == f"[failed] run #{run.pk} lake" and "ValueError: reward raised at row 3" in body["message"]
    assert deliver_due(now=timezone.now() + timedelta(hours=4))["sent"] == 0  # sent once


def test_finish_and_cancel_by_email_to_the_runs_owner(make_run, owner):
    rule = AlertRule(user=owner, created_by=owner, events=["succeeded", "cancelled"])
    rule.target = "owner@example.org"
    rule.save()
    done = running(make_run, name="done")
    done.finish("succeeded", steps=2)
    queued = make_run(name="never started")
    queued.request_cancel()
    other = running(make_run, name="failing")
    other.finish("failed", error="boom")  # not an event this rule asked for

    assert deliver_due()["sent"] == 2
    subjects = sorted(message.subject for message in mail.outbox)
    assert subjects == [f"[cancelled] run #{queued.pk} never started", f"[succeeded] run #{done.pk} done"]
    assert all(message.to == ["owner@example.org"] for message in mail.outbox)


def test_a_delivery_that_keeps_failing_is_marked_failed_and_shown_on_the_project_page(
        receiver, project_rule, make_run, project, settings, owner, client):
    settings.ALERT_MAX_ATTEMPTS = 2
    project_rule(receiver.target, ["failed"])
    run = running(make_run, project=project, visibility="team")
    run.finish("failed", error="boom")
    receiver.statuses = [500, 503]
    deliver_due()
    assert deliver_due(now=timezone.now() + timedelta(hours=1)) == {"sent": 0, "retry": 0, "failed": 1}
    assert AlertDelivery.objects.get().status == "failed"

    client.force_login(owner)
    page = client.get(f"/projects/{project.pk}/integrations/").content.decode()
    assert 'class="delivery delivery-failed"' in page and "attempt 2:" in page


def test_threshold_and_nan_alerts_fire_once_from_the_training_process(project_rule, make_run, project, receiver):
    low = project_rule(receiver.target, ["threshold"], metric="reward", op="<", threshold=0.1, after_step=2)
    nan = project_rule(receiver.target, ["threshold"], metric="loss", op="nan")
    run = running(make_run, project=project, visibility="team")
    sink = ThresholdSink(run)
    sink.log_metrics(1, {"reward": 0.0, "loss": 1.0})  # below, but before step 2
    sink.log_metrics(2, {"reward": 0.5, "loss": math.nan})
    sink.log_metrics(3, {"reward": 0.05, "loss": 1.0})
    sink.log_metrics(4, {"reward": 0.0, "loss": math.nan})
    deliveries = {d.rule_id: d for d in AlertDelivery.objects.all()}
    assert set(deliveries) == {low.pk, nan.pk}
    assert "reward=0.05 at step 3" in deliveries[low.pk].title and "at step 2" in deliveries[nan.pk].title
    assert deliver_due()["sent"] == 2 and len(receiver.bodies) == 2


def test_a_run_that_goes_quiet_is_reported_once(project_rule, make_run, project, receiver):
    from webapp.dashboard.series import SeriesWriter
    from webapp.runs.models import Run

    project_rule(receiver.target, ["quiet"], quiet_minutes=10)
    run = running(make_run, project=project, visibility="team")
    SeriesWriter(run.pk).write([("reward", 1, 0.5)])
    Run.objects.filter(pk=run.pk).update(metrics_at=timezone.now() - timedelta(minutes=4))  # the step came 4 minutes ago
    assert find_quiet_runs() == 0
    assert find_quiet_runs(now=timezone.now() + timedelta(minutes=7)) == 1
    assert find_quiet_runs(now=timezone.now() + timedelta(minutes=30)) == 0
    assert "no step for 11 min" in AlertDelivery.objects.get().title or "no step for 10 min" in AlertDelivery.objects.get().title


def test_webhooks_to_private_addresses_and_other_schemes_are_refused(settings):
    from webapp.integrations.forms import AlertRuleForm

    settings.EGRESS_ALLOWED_HOSTS = ()
    for target, message in [
        ("json://127.0.0.1:6379/x", "refused by the egress guard: 127.0.0.1 is a loopback address"),
        ("json://169.254.169.254/latest", "refused by the egress guard: 169.254.169.254 is a link-local address"),
        ("windows://", "not a webhook this platform sends to"),
        ("not-an-address", "neither an email address nor a webhook URL"),
    ]:
        form = AlertRuleForm({"target": target, "events": ["failed"]})
        assert not form.is_valid() and message in str(form.errors["target"]), target
    form = AlertRuleForm({"target": "me@example.org", "events": ["quiet"]})
    assert not form.is_valid() and "how many minutes" in str(form.errors["quiet_minutes"])


def test_a_project_rule_covers_team_visible_runs_only_and_a_persons_rule_their_own(
        receiver, project_rule, make_run, project, teammate):
    project_rule(receiver.target, ["failed"])  # chosen by the team's owner
    mine = AlertRule(user=teammate, created_by=teammate, events=["failed"])
    mine.target = "teammate@example.org"
    mine.save()
    private = running(make_run, project=project, owner=teammate, name="my secret experiment")
    private.finish("failed", error="KeyError: my-private-dataset-column")
    shared = running(make_run, project=project, owner=teammate, name="shared", visibility="team")
    shared.finish("failed", error="boom")

    assert deliver_due()["sent"] == 3  # the project's target gets the shared run; the teammate both of theirs
    assert [body["title"] for body in receiver.bodies] == [f"[failed] run #{shared.pk} shared"]
    assert sorted(message.subject for message in mail.outbox) == sorted(
        [f"[failed] run #{private.pk} my secret experiment", f"[failed] run #{shared.pk} shared"])


CONSOLE = "django.core.mail.backends.console.EmailBackend"


@pytest.mark.parametrize("backend", [CONSOLE, "django.core.mail.backends.smtp.EmailBackend"])
def test_email_alerts_say_when_they_only_go_to_the_console(backend, settings, page_client, owner, make_run, capsys):
    """Embedded mode prints email to the console: the page where the alert is set up, the rule and
    its deliveries say so, where a person would otherwise wait for mail that never comes."""
    from webapp.integrations.alerts import EMAIL_PRINTED_NOTE

    settings.EMAIL_BACKEND = backend
    client = page_client(owner)
    added = client.post("/alerts/", {"target": "owner@example.org", "events": ["succeeded"]}, follow=True)
    text = added.content.decode().replace("&#x27;", "'")
    printed = backend == CONSOLE
    assert (EMAIL_PRINTED_NOTE in text) is printed  # the form's note and the "added" message
    assert text.count(EMAIL_PRINTED_NOTE) == (2 if printed else 0)
    assert ("(printed to the console, not sent)" in text) is printed

    if printed:
        running(make_run, name="done").finish("succeeded", steps=2)
        assert deliver_due()["sent"] == 1
        assert "owner@example.org" in capsys.readouterr().out  # where the mail went: this process's console
        page = client.get("/alerts/").content.decode()
        assert "printed to the console, not sent</span>" in page
