"""Alerts: when a run fails, finishes, is cancelled, goes quiet, a metric crosses a threshold, or a
reward-health monitor crosses a project's monitor rule.

Events become rows of an outbox (``AlertDelivery``, one per rule, run and event) in the process
where they happen; nothing is sent there, so training and status changes never wait on a mail
server or a webhook. ``deliver_due()`` sends what is due (Celery task ``integrations.deliver_alerts``
right after the event, and the workers' housekeeping through ``tick()``): email through Django's
email backend, webhooks (Slack, Discord, generic JSON) through apprise. A failed attempt is retried
with exponential backoff; after ``ALERT_MAX_ATTEMPTS`` the delivery is marked failed and shows on
the project page. A claim is a lease (filtered update), so a crashed sender's delivery is sent
again: at least once.
"""

from __future__ import annotations

import logging
import math
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from training.isolation.egress import EgressProxy, EgressRefused
from webapp.celery_app import app as celery_app  # sends by task name: the web side never imports workers
from webapp.integrations.models import AlertDelivery, AlertRule
from webapp.integrations.targets import SERVER_SCHEMES, WEBHOOK_SCHEMES, egress_guard, plugin_of, server_url, target_label
from webapp.monitors import health
from webapp.monitors.models import MonitorCheck, MonitorRule
from webapp.runs.models import Run, run_status_changed

logger = logging.getLogger(__name__)

LEASE_SECONDS = 60
# Runs whose monitors one housekeeping sweep reads at most (newest metric points first): those
# running or ended within MONITOR_ENDED_WITHIN, and besides them, at most MONITOR_BACKLOG_PER_TICK of
# the runs that ended earlier with points no sweep has read (ended while every worker was down).
MONITOR_RUNS_PER_TICK = 20
MONITOR_ENDED_WITHIN = timedelta(hours=1)
MONITOR_BACKLOG_PER_TICK = 5
# Alerts one monitor rule sends at most for one run: one per crossing (the first step of a stretch
# above its threshold), the earliest crossings first.
MONITOR_ALERTS_PER_RUN = 10
FINAL_EVENTS = {"failed", "succeeded", "cancelled"}


class DeliveryFailed(Exception):
    """A delivery failed; the message is ours (the guard's refusal, a status code), safe to show."""


CONSOLE_EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
EMAIL_PRINTED_NOTE = ("Email alerts are printed to the platform's console (the terminal running its server and "
                      "worker, e.g. make run), not sent: EMAIL_BACKEND is Django's console backend, the embedded "
                      "default. To send mail, an administrator sets EMAIL_BACKEND and EMAIL_HOST.")


def emails_printed() -> bool:
    """Whether an email alert only goes to the console (embedded mode's default), not to anyone's inbox."""
    return settings.EMAIL_BACKEND == CONSOLE_EMAIL_BACKEND


# -- events ---------------------------------------------------------------------------------------

def rules_for(run) -> models.QuerySet:
    """The rules that cover ``run``: its owner's own rules, and its project's rules when the run is
    team-visible (a project's rule goes where a team admin chose; a private run is the owner's)."""
    mine = models.Q(user_id=run.owner_id)
    if run.project_id and run.visibility == Run.Visibility.TEAM:
        mine |= models.Q(project_id=run.project_id)
    return AlertRule.objects.filter(mine, enabled=True)


def enqueue(rule, run, event: str, title: str, body: str) -> bool:
    """Add one delivery to the outbox (once per rule, run and event); sending happens elsewhere."""
    try:
        with transaction.atomic():
            AlertDelivery.objects.create(rule=rule, run=run, event=event, title=title[:300], body=body)
    except IntegrityError:  # already told
        return False
    transaction.on_commit(_kick_sender)
    return True


def _kick_sender() -> None:
    """Ask a worker to send now. No broker (e.g. the web tier lost Redis): housekeeping sends later."""
    try:
        celery_app.send_task("integrations.deliver_alerts", queue=settings.ALERT_QUEUE, retry=False)
    except Exception as exc:
        logger.warning("alerts: could not queue delivery (%s); the next housekeeping tick sends it", exc)


def _run_url(run) -> str:
    return f"{settings.PLATFORM_URL.rstrip('/')}{run.get_absolute_url()}"


def _describe(run) -> str:
    lines = [f"Run #{run.pk} {run.name}".strip() + f" is {run.status} after {run.steps} step(s).", _run_url(run)]
    if run.error:
        lines.insert(1, f"Error: {run.error[:2000]}")
    return "\n".join(lines)


def on_status_changed(sender, run, **kwargs) -> None:
    """``run_status_changed``: a final status is an event for each rule that asked for it."""
    if run.status not in FINAL_EVENTS:
        return
    for rule in rules_for(run):
        if run.status in rule.events:
            enqueue(rule, run, run.status, f"[{run.status}] run #{run.pk} {run.name}".strip(), _describe(run))


def connect() -> None:
    run_status_changed.connect(on_status_changed, dispatch_uid="integrations.alerts")


def crossed(rule, step: int, value: float) -> bool:
    if step < rule.after_step:
        return False
    if rule.op == rule.Op.NAN:
        return math.isnan(value) or math.isinf(value)
    if math.isnan(value) or rule.threshold is None:
        return False
    return value < rule.threshold if rule.op == rule.Op.BELOW else value > rule.threshold


class ThresholdSink:
    """A metric sink in the training process: the first step at which a rule's metric crosses its
    threshold adds that rule's alert to the outbox (an insert, never a send)."""

    def __init__(self, run) -> None:
        self.run = run
        self.rules = [r for r in rules_for(run) if "threshold" in r.events and r.metric and r.op]
        self.told: set[int] = set()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for rule in self.rules:
            if rule.pk in self.told or rule.metric not in metrics:
                continue
            value = metrics[rule.metric]
            if crossed(rule, step, value):
                self.told.add(rule.pk)
                title = f"[threshold] run #{self.run.pk}: {rule.metric}={value:g} at step {step}"
                enqueue(rule, self.run, "threshold", title,
                        f"{rule.describe_threshold()}: {rule.metric} was {value:g} at step {step}.\n{_run_url(self.run)}")

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass


def find_quiet_runs(now=None) -> int:
    """Running runs with no new step for a rule's ``quiet_minutes``: one alert per rule and run."""
    now = now or timezone.now()
    added = 0
    running = Run.objects.filter(status=Run.Status.RUNNING)
    for run in running:
        rules = [r for r in rules_for(run) if "quiet" in r.events and r.quiet_minutes]
        if not rules:
            continue
        last = run.metrics_at or run.started_at or run.created_at
        for rule in rules:
            if now - last >= timedelta(minutes=rule.quiet_minutes):
                minutes = int((now - last).total_seconds() // 60)
                added += enqueue(rule, run, "quiet", f"[quiet] run #{run.pk} {run.name}: no step for {minutes} min".strip(),
                                 f"Run #{run.pk} has logged no step since {last:%Y-%m-%d %H:%M:%S} UTC "
                                 f"({minutes} min; the rule says {rule.quiet_minutes}).\n{_run_url(run)}")
    return added


def _evidence_url(run, step: int, window: int) -> str:
    """The evidence the run page opens for an alert at ``step``."""
    return f"{settings.PLATFORM_URL.rstrip('/')}/api/runs/{run.pk}/monitors/evidence/?step={step}&window={window}"


def monitor_runs(now=None, limit: int = MONITOR_RUNS_PER_TICK, backlog: int = MONITOR_BACKLOG_PER_TICK) -> list[Run]:
    """The runs whose monitors are to be read: team-visible runs of a project with a monitor rule that
    alerts, with metric points newer than the last read (or never read), newest points first: at most
    ``limit`` of those running or ended within ``MONITOR_ENDED_WITHIN``, and at most ``backlog`` of those
    that ended earlier (a run that ended while every worker was down is read late, not never). A run
    that ended before every such rule of its project was made is not read: a new rule does not alert
    for the project's history."""
    now = now or timezone.now()
    rules = MonitorRule.objects.filter(project_id=models.OuterRef("project_id"), enabled=True, alert__enabled=True)
    watched = (models.Q(finished_at__isnull=True) & models.Exists(rules)) | models.Exists(
        rules.filter(created_at__lte=models.OuterRef("finished_at")))
    fresh = models.Q(monitor_check__isnull=True) | models.Q(monitor_check__metrics_at__lt=models.F("metrics_at"))
    unread = (Run.objects.filter(visibility=Run.Visibility.TEAM, metrics_at__isnull=False, project__isnull=False)
              .filter(watched, fresh).order_by("-metrics_at", "-pk"))
    live = models.Q(status=Run.Status.RUNNING) | models.Q(finished_at__isnull=True) | models.Q(finished_at__gte=now - MONITOR_ENDED_WITHIN)
    return [*unread.filter(live)[:limit], *unread.exclude(live)[:backlog]]


def check_monitors(run) -> int:
    """Read ``run``'s monitors against its project's alerting rules: each crossing of a rule (the first
    step of a stretch above its threshold, ``health.crossings``) adds one alert to the outbox, keyed
    ``monitor:<rule>@<step>``, so the outbox's uniqueness tells each crossing once however many
    workers and sweeps read it, and a run whose monitor falls back under the threshold and crosses
    it again is told again. At most ``MONITOR_ALERTS_PER_RUN`` per rule and run (the earliest; counted
    under the rule's row lock, so two sweeps at once never pass it). A rule made after the run ended
    does not alert for it."""
    rules = list(MonitorRule.objects.filter(project_id=run.project_id, enabled=True, alert__enabled=True).select_related("alert"))
    rules = [rule for rule in rules if run.finished_at is None or rule.created_at <= run.finished_at]
    if not rules:
        return 0
    data = health.RunData(run)
    added = 0
    for rule in rules:
        found, source = health.crossings(data, rule)
        if found:
            added += _tell_crossings(rule, run, found, source)
    return added


def monitor_event(rule: MonitorRule, step: int) -> str:
    """The outbox event of ``rule``'s crossing at ``step``."""
    return f"monitor:{rule.pk}@{step}"


def _tell_crossings(rule: MonitorRule, run, found: list[tuple[int, float]], source: str) -> int:
    added = 0
    with transaction.atomic():
        MonitorRule.objects.select_for_update().filter(pk=rule.pk).first()  # one sweep at a time counts this rule's alerts
        told = set(AlertDelivery.objects.filter(rule=rule.alert, run=run, event__startswith=f"monitor:{rule.pk}@")
                   .values_list("event", flat=True))
        for step, value in found:
            event = monitor_event(rule, step)
            if event in told:
                continue
            if len(told) >= MONITOR_ALERTS_PER_RUN:
                logger.info("alerts: monitor rule %s has told run %s %d times; no more alerts for it", rule.pk, run.pk, len(told))
                break
            title = f"[monitor] run #{run.pk}: {rule.get_monitor_display()} {value:g} at step {step}"
            body = (f"Run #{run.pk} {run.name}".strip() + f" crossed the monitor rule {rule.get_monitor_display()} > "
                    f"{rule.threshold:g} (over {rule.window} step(s), read from {source}): {value:g} at step {step}.\n"
                    f"Run: {_run_url(run)}\nEvidence: {_evidence_url(run, step, rule.window)}")
            added += enqueue(rule.alert, run, event, title, body)
            told.add(event)
    return added


def find_monitor_crossings(now=None, limit: int = MONITOR_RUNS_PER_TICK) -> int:
    """Housekeeping: read the monitors of the runs with new metric points (``monitor_runs``), each
    marked as read through the ``metrics_at`` it had, so the next sweep skips it until it logs more."""
    added = 0
    for run in monitor_runs(now, limit):
        try:
            added += check_monitors(run)
        except Exception:
            logger.exception("alerts: the monitors of run %s could not be read", run.pk)
        MonitorCheck.objects.update_or_create(run=run, defaults={"metrics_at": run.metrics_at})
    return added


# -- delivery -------------------------------------------------------------------------------------

def backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(settings.ALERT_RETRY_BASE_SECONDS * 2 ** (attempts - 1), settings.ALERT_RETRY_MAX_SECONDS))


def send(target: str, title: str, body: str) -> None:
    """One attempt. Raises DeliveryFailed (or the mail backend's error) on failure.

    A webhook is posted by apprise through the egress guard's proxy: its server is judged before
    anything is sent, and the address each connection is made to is judged as it is made."""
    if "://" not in target:
        send_mail(title, body, settings.DEFAULT_FROM_EMAIL, [target], fail_silently=False)
        return
    import apprise

    scheme = target.split("://", 1)[0].lower()
    plugin = plugin_of(target)
    if scheme not in WEBHOOK_SCHEMES or plugin is None:
        raise DeliveryFailed(f"the target {target_label(target)} is not a webhook this platform sends to.")
    guard = egress_guard()
    if scheme in SERVER_SCHEMES:
        try:
            guard.check_url(server_url(plugin))
        except EgressRefused as exc:
            raise DeliveryFailed(f"the webhook's server {plugin.host}: {exc}") from None
    notifier = apprise.Apprise()
    notifier.add(plugin)
    with EgressProxy(guard) as proxy, proxy.route() as route:
        ok = notifier.notify(title=title, body=body)
    if not ok:
        raise DeliveryFailed(route.failure(f"the webhook {target_label(target)}"))


def deliver_due(now=None, limit: int = 50) -> dict[str, int]:
    """Send due deliveries. Each is claimed with a filtered update (a lease), so two senders never
    both send it and a sender that dies leaves it to be sent again once the lease expires."""
    now = now or timezone.now()
    counts = {"sent": 0, "retry": 0, "failed": 0}
    due = AlertDelivery.objects.filter(status=AlertDelivery.Status.PENDING, next_attempt_at__lte=now)
    for delivery in due.select_related("rule")[:limit]:
        lease = now + timedelta(seconds=LEASE_SECONDS)
        claimed = AlertDelivery.objects.filter(pk=delivery.pk, status=AlertDelivery.Status.PENDING,
                                               next_attempt_at=delivery.next_attempt_at).update(next_attempt_at=lease)
        if not claimed:
            continue
        attempts = delivery.attempts + 1
        try:
            send(delivery.rule.target, delivery.title, delivery.body)
        except Exception as exc:
            logger.info("alert %s, attempt %s: %r", delivery.pk, attempts, exc)  # the whole error, for admins
            # Members read last_error on the project page: our words only, never a remote's text.
            reason = str(exc) if isinstance(exc, DeliveryFailed) else f"{type(exc).__name__} (details in the worker's log)"
            error = f"attempt {attempts}: {reason}"[:2000]
            if attempts >= settings.ALERT_MAX_ATTEMPTS:
                AlertDelivery.objects.filter(pk=delivery.pk).update(status=AlertDelivery.Status.FAILED, attempts=attempts, last_error=error)
                counts["failed"] += 1
                logger.warning("alert %s failed for good: %s", delivery.pk, error)
            else:
                AlertDelivery.objects.filter(pk=delivery.pk).update(attempts=attempts, last_error=error, next_attempt_at=now + backoff(attempts))
                counts["retry"] += 1
            continue
        AlertDelivery.objects.filter(pk=delivery.pk).update(status=AlertDelivery.Status.SENT, attempts=attempts, sent_at=timezone.now())
        counts["sent"] += 1
    return counts


def next_due_in(now=None) -> float | None:
    """Seconds until the next pending delivery is due (None: nothing pending)."""
    now = now or timezone.now()
    first = AlertDelivery.objects.filter(status=AlertDelivery.Status.PENDING).order_by("next_attempt_at").values_list("next_attempt_at", flat=True).first()
    return None if first is None else max(0.0, (first - now).total_seconds())


def tick() -> None:
    """For a periodic loop (the workers' housekeeping): quiet runs, monitor crossings, then due
    deliveries. Never raises."""
    try:
        find_monitor_crossings()
    except Exception:  # a monitor that cannot be read never holds back the deliveries
        logger.exception("alerts: the monitor check failed")
    try:
        find_quiet_runs()
        deliver_due()
    except Exception:
        logger.exception("alerts: housekeeping tick failed")
