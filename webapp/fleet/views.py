"""The workers page (admins): who is online, their queues and slots (busy of total), the runs they hold, what
each queue holds (runs queued and running, playground questions); drain and resume."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from webapp.fleet import control
from webapp.fleet.queues import QueueBoard
from webapp.registry.models import Backend


@staff_member_required
def workers_page(request):
    board = QueueBoard.load()
    return render(request, "fleet/workers.html", {
        "workers": control.list_workers(board),
        "queues": board.queues(),
        "backends": Backend.objects.all(),
    })


@staff_member_required
@require_POST
def drain_worker(request, name: str):
    queues = control.drain(name, user=request.user)
    messages.info(request, f"{name} is drained: it finishes its current run and takes none from {', '.join(queues) or 'its queues'}.")
    return redirect("fleet:workers")


@staff_member_required
@require_POST
def resume_worker(request, name: str):
    queues = control.resume(name, user=request.user)
    messages.info(request, f"{name} takes runs again from {', '.join(queues) or 'its queues'}.")
    return redirect("fleet:workers")
