"""The playground page of a run, the ask endpoint and the answer's poll. Nothing here loads a
model: asking writes a request row; a worker of the playground's queue (its own, or the run's)
answers it, and while it waits the poll says behind what."""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from webapp.fleet.queues import QueueBoard
from webapp.playground.forms import AskForm, model_choices, playground_queue
from webapp.playground.models import PlaygroundRequest
from webapp.runs import forks
from webapp.runs.access import can, get_run_for_user
from webapp.policy.limits import capped

MAX_BODY_BYTES = 64_000


@login_required
@require_GET
def playground(request, pk: int):
    run = get_run_for_user(request.user, pk, "view")
    return render(request, "playground/playground.html", {
        "run": run, "form": AskForm(run=run), "models": model_choices(run), "may_ask": can(request.user, run, "run"),
        "chosen": request.GET.get("model", "")[:100],  # a link to one saved model (a checkpoint's alias) preselects it
        "rows": run.kind == run.Kind.PLATFORM and run.agent_id is not None,
        "checkpoint_steps": forks.checkpoint_steps(run) if run.kind == run.Kind.PLATFORM else [],  # to fork a new run from
        "queue": playground_queue(run), "own_queue": bool(settings.PLAYGROUND_QUEUE),
        "limits": {"queue_seconds": settings.PLAYGROUND_QUEUE_SECONDS, "reply_seconds": settings.PLAYGROUND_REPLY_SECONDS,
                   "max_new_tokens": settings.PLAYGROUND_MAX_NEW_TOKENS},
    })


@login_required
@require_POST
def ask(request, pk: int) -> JsonResponse:
    """A JSON body ``{"kind": "chat", "model": "final_model", "messages": [...], "max_new_tokens": 64,
    "temperature": 0}`` (or ``"kind": "row", "split": "test", "row": 3``): 201 with the request's
    id and poll URL, 400 naming each bad field, 403 for who may see the run but not run it (a
    viewer: a question takes a worker), 429 when this person already waits for answers."""
    run = get_run_for_user(request.user, pk, "view")
    if not can(request.user, run, "run"):
        return JsonResponse({"error": "Only people who may start runs in this run's project may ask its models: "
                                      "a question takes a worker."}, status=403)
    if len(request.body) > MAX_BODY_BYTES:
        return JsonResponse({"error": f"A request is at most {MAX_BODY_BYTES} bytes."}, status=400)
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return JsonResponse({"error": "The body must be JSON."}, status=400)
    if not isinstance(body, dict):
        return JsonResponse({"error": "The body must be a JSON object."}, status=400)
    data = {**body, "messages": json.dumps(body.get("messages") or [])}
    form = AskForm(data, run=run)
    if not form.is_valid():
        errors = {field: [capped(str(e)) for e in messages] for field, messages in form.errors.items()}
        return JsonResponse({"error": " ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()), "errors": errors}, status=400)
    waiting = PlaygroundRequest.objects.pending().filter(user=request.user).count()
    if waiting >= settings.PLAYGROUND_MAX_PENDING:
        return JsonResponse({"error": f"You already wait for {waiting} answer(s); ask again when they are in."}, status=429)
    asked = form.save(request.user)
    return JsonResponse({"id": asked.pk, "url": reverse("playground:answer", args=[asked.pk]), **_state(asked, request.user)},
                        status=201)


@login_required
@require_GET
def answer(request, pk: int) -> JsonResponse:
    """The request's state: queued (with how many are ahead), running, or its answer or error."""
    asked = PlaygroundRequest.objects.select_related("run").filter(pk=pk).first()
    if asked is None or not (asked.user_id == request.user.pk or request.user.is_superuser) \
            or not can(request.user, asked.run, "view"):
        raise Http404("No such request.")
    asked.expire_if_overdue()
    return JsonResponse({"id": asked.pk, **_state(asked, request.user)})


def _state(asked: PlaygroundRequest, user) -> dict:
    state = {"status": asked.status, "queue": asked.queue, "reply": asked.reply, "error": asked.error,
             "episode": asked.episode, "prompt_tokens": asked.prompt_tokens, "reply_tokens": asked.reply_tokens,
             "worker": asked.worker, "device": asked.device}
    if asked.status == asked.Status.QUEUED:
        state["ahead"] = asked.position()
        state["waiting"] = QueueBoard.load().question_waiting(asked, user)  # behind which runs, at which place
    return state
