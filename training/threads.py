"""Threads for user code that may never return."""

from __future__ import annotations

import threading
from concurrent.futures import Executor, Future
from typing import Any, Callable


class DaemonThreadExecutor(Executor):
    """Runs each call in a daemon thread of its own, and ``shutdown`` never waits.

    Blocking user code (environment steps, plain run functions, a workflow's ``run_in_executor``)
    runs here so that a call that never returns is abandoned when its episode reaches
    ``rllm.agent.trajectory_timeout``: a ``ThreadPoolExecutor``'s threads are joined by
    ``asyncio.run`` (the loop's default executor) and again at interpreter exit, so one environment
    step stuck forever would hang the run after its episode had already timed out.
    """

    def __init__(self, name: str = "episode") -> None:
        self._name = name
        self._closed = False

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        if self._closed:
            raise RuntimeError("DaemonThreadExecutor: cannot run new calls after shutdown.")
        future: Future = Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the awaiting episode as it is
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=work, name=self._name, daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls; calls still running are left to finish (or not) on their own."""
        self._closed = True
