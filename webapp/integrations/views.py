"""A project's integrations page (tracking targets, alert rules, deliveries) and a person's alerts.

Team members see the page; only the team's owners and admins change it. Secrets never come back
out: the page says whether a key is set and shows webhook targets without their tokens.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from webapp.integrations.alerts import EMAIL_PRINTED_NOTE, emails_printed
from webapp.integrations.forms import AlertRuleForm, TrackingTargetForm
from webapp.integrations.models import AlertDelivery, AlertRule, TrackingTarget
from webapp.monitors.forms import MonitorRuleForm, suggested_thresholds
from webapp.monitors.models import MonitorRule
from webapp.teams import roster
from webapp.teams.access import can_in_project
from webapp.teams.models import Project


def _project_for(user, pk: int, manage: bool = False) -> Project:
    project = Project.objects.select_related("team").filter(pk=pk).first()
    if project is None or not can_in_project(user, project, "view"):
        raise Http404("No such project.")
    if manage and not (user.is_superuser or roster.may_manage(user, project.team)):
        raise PermissionDenied("Only the team's owners and admins change its integrations.")
    return project


@login_required
def project_integrations(request, pk: int, tracking_form=None, rule_form=None, monitor_form=None):
    project = _project_for(request.user, pk)
    target = TrackingTarget.objects.filter(project=project).first()
    return render(request, "integrations/project.html", {
        "project": project, "target": target,
        "may_manage": request.user.is_superuser or roster.may_manage(request.user, project.team),
        "tracking_form": tracking_form or TrackingTargetForm(instance=target),
        "rule_form": rule_form or AlertRuleForm(),
        "rules": project.alert_rules.all(),
        "deliveries": AlertDelivery.objects.filter(rule__project=project).select_related("rule", "run")[:50],
        "emails_printed": emails_printed(), "email_printed_note": EMAIL_PRINTED_NOTE,
        "monitor_rules": project.monitor_rules.select_related("alert"), "monitor_form": monitor_form or MonitorRuleForm(project=project),
        "monitors": suggested_thresholds(),
    })


@login_required
@require_POST
def save_monitor_rule(request, pk: int):
    """Turn a reward-health monitor's rule on (or change it: one rule per monitor)."""
    project = _project_for(request.user, pk, manage=True)
    form = MonitorRuleForm(request.POST, project=project)
    if not form.is_valid():
        return project_integrations(request, pk, monitor_form=form)
    rule = form.save(project, request.user)
    messages.success(request, f"Monitor rule on: {rule.get_monitor_display()} above {rule.threshold:g} over {rule.window} step(s).")
    return redirect("integrations:project", pk=pk)


@login_required
@require_POST
def delete_monitor_rule(request, pk: int):
    rule = get_object_or_404(MonitorRule, pk=pk)
    _project_for(request.user, rule.project_id, manage=True)
    rule.delete()
    messages.info(request, "Monitor rule removed.")
    return redirect("integrations:project", pk=rule.project_id)


@login_required
@require_POST
def save_tracking(request, pk: int):
    project = _project_for(request.user, pk, manage=True)
    target = TrackingTarget.objects.filter(project=project).first() or TrackingTarget(project=project)
    form = TrackingTargetForm(request.POST, instance=target)
    if not form.is_valid():
        return project_integrations(request, pk, tracking_form=form)
    form.save(request.user)
    messages.success(request, "Tracking targets saved; new runs of this project report there.")
    for secret in form.cleared:
        messages.warning(request, f"The stored {secret} was removed: a secret goes only to the destination it was "
                                  "entered for. Enter it again to use it there.")
    return redirect("integrations:project", pk=pk)


@login_required
@require_POST
def add_project_rule(request, pk: int):
    project = _project_for(request.user, pk, manage=True)
    form = AlertRuleForm(request.POST)
    if not form.is_valid():
        return project_integrations(request, pk, rule_form=form)
    rule = form.save(creator=request.user, project=project)
    messages.success(request, "Alert added." + _printed_note(rule))
    return redirect("integrations:project", pk=pk)


@login_required
def my_alerts(request):
    form = AlertRuleForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        rule = form.save(creator=request.user, user=request.user)
        messages.success(request, "Alert added: it covers the runs you own." + _printed_note(rule))
        return redirect("integrations:mine")
    return render(request, "integrations/my_alerts.html", {
        "rule_form": form, "rules": request.user.alert_rules.all(),
        "deliveries": AlertDelivery.objects.filter(rule__user=request.user).select_related("rule", "run")[:50],
        "emails_printed": emails_printed(), "email_printed_note": EMAIL_PRINTED_NOTE,
    })


def _printed_note(rule) -> str:
    """Said when the rule just added emails someone who, in this mode, will get nothing."""
    return f" {EMAIL_PRINTED_NOTE}" if emails_printed() and rule.is_email else ""


@login_required
@require_POST
def delete_rule(request, pk: int):
    rule = get_object_or_404(AlertRule, pk=pk)
    if rule.user_id is not None:
        if rule.user_id != request.user.pk:
            raise Http404("No such alert.")
        rule.delete()
        return redirect("integrations:mine")
    _project_for(request.user, rule.project_id, manage=True)
    rule.delete()
    messages.info(request, "Alert removed.")
    return redirect("integrations:project", pk=rule.project_id)
