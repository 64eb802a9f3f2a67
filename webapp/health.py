"""``/healthz``: 200 when the database and the broker answer, 503 otherwise, with each state."""

from __future__ import annotations

from django.db import connection
from django.http import JsonResponse

from webapp.celery_app import app


def _database_state() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception as exc:
        return f"error: {exc.__class__.__name__}: {exc}"


def _broker_state() -> str:
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception as exc:
        return f"error: {exc.__class__.__name__}: {exc}"


def healthz(request):
    states = {"database": _database_state(), "broker": _broker_state()}
    healthy = all(state == "ok" for state in states.values())
    return JsonResponse({"status": "ok" if healthy else "error", **states}, status=200 if healthy else 503)
