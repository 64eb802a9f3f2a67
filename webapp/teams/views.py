"""Share links (create, revoke, the read-only page they open) and the user's teams."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from webapp.runs.access import get_run_for_user
from webapp.teams.models import Membership, ShareLink


def shared_run(request, token: str):
    """The read-only page a share link opens, with the run's live dashboard (its charts, episodes
    and websocket ask with the same token); 404 once the link is revoked."""
    link = ShareLink.objects.active().filter(token=token).values("run_id").first()
    if link is None:
        raise Http404("This link does not exist or was revoked.")
    run = get_run_for_user(request.user, link["run_id"], "view", share_token=token)
    return render(request, "teams/shared_run.html", {
        "run": run, "metrics": sorted(run.latest_metrics().items()), "share_query": "?" + urlencode({"share": token}),
    })


@login_required
@require_POST
def create_share(request, pk: int):
    run = get_run_for_user(request.user, pk, "edit")
    ShareLink.objects.create(run=run, created_by=request.user)
    messages.success(request, "Share link created; anyone with it can view this run until you revoke it.")
    return redirect(run)


@login_required
@require_POST
def revoke_share(request, pk: int):
    link = get_object_or_404(ShareLink, pk=pk)
    run = get_run_for_user(request.user, link.run_id, "edit")
    link.revoke()
    messages.info(request, "Share link revoked.")
    return redirect(run)


@login_required
def my_teams(request):
    memberships = Membership.objects.filter(user=request.user).select_related("team").prefetch_related("team__projects")
    return render(request, "teams/my_teams.html", {"memberships": memberships})
