"""The workers' database sessions: no transaction of theirs holds its locks for ever.

A training process writes its reports, and publishes its checkpoints, inside transactions that lock
its run's row (``webapp.runs.models.lock_for_attempt``, ``workers.lifecycle.Fence.holding``). A
process frozen inside one (a paused VM, a stopped process, a partition) would keep that lock for
as long as it is frozen, and the takeover that must update the row (``Run.recover``, run by every
other worker's housekeeping thread) would wait behind it for ever: the run stuck, and that
worker's housekeeping with it. So PostgreSQL ends a worker's session that stays idle inside a
transaction for ``2 x RUN_STALE_SECONDS`` (``idle_in_transaction_session_timeout``), letting its
locks go. A process that wakes after that finds its connection gone (a database error: its
writers retry, through the spool) and its run taken over (``Fence``), and writes nothing.

What remains: a process frozen in the middle of the action ``Fence.holding`` runs under the lock
(a rename, microseconds) finishes that one rename when it wakes. Web processes are not bounded
this way (a page holds no lock a takeover waits for).
"""

from __future__ import annotations

from django.conf import settings
from django.db import connections
from django.db.backends.signals import connection_created


def idle_transaction_limit_ms() -> int:
    return int(2 * settings.RUN_STALE_SECONDS * 1000)


def bound_idle_transactions() -> None:
    """From now on, every PostgreSQL session this process (and the processes it forks) opens ends
    itself when idle inside a transaction past the limit. Open connections are closed, so each is
    opened again with it."""
    connection_created.connect(_set_limit, dispatch_uid="workers.database.bound_idle_transactions")
    connections.close_all()


def _set_limit(sender, connection, **kwargs) -> None:
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", [str(idle_transaction_limit_ms())])
