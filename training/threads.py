"""Threads for user code that may never return."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Executor, Future
from typing import Any, Callable

# A thread with nothing to do for this long ends; a busy run keeps its threads.
IDLE_SECONDS = 30.0


class DaemonThreadExecutor(Executor):
    """Runs calls in daemon threads, and ``shutdown`` never waits.

    Blocking user code (environment steps, plain run functions, a workflow's ``run_in_executor``)
    runs here so that a call that never returns is abandoned when its episode reaches
    ``rllm.agent.trajectory_timeout``: a ``ThreadPoolExecutor``'s threads are joined by
    ``asyncio.run`` (the loop's default executor) and again at interpreter exit, so one environment
    step stuck forever would hang the run after its episode had already timed out.

    Threads are reused: a call goes to a thread that is waiting for work, and a new thread starts only
    when none is (a rollout makes hundreds of environment calls a step; a thread started for each cost
    more than the calls). A stuck call keeps its thread and no other call waits for it.
    """

    def __init__(self, name: str = "episode") -> None:
        self._name = name
        self._closed = False
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting = threading.Semaphore(0)  # one count for each thread waiting for a call
        self._lock = threading.Lock()
        self._threads = 0

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        if self._closed:
            raise RuntimeError("DaemonThreadExecutor: cannot run new calls after shutdown.")
        future: Future = Future()
        self._calls.put((future, fn, args, kwargs))
        if not self._waiting.acquire(blocking=False):  # no thread is free to take it
            with self._lock:
                self._threads += 1
            threading.Thread(target=self._serve, name=self._name, daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            try:
                call = self._calls.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                if self._waiting.acquire(blocking=False):  # nobody counted on this thread: end it
                    break
                continue  # a caller took this thread's count; its call is on the way
            if call is None:  # shutdown
                break
            future, fn, args, kwargs = call
            outcome, failed = None, False
            if future.set_running_or_notify_cancel():
                try:
                    outcome = fn(*args, **kwargs)
                except BaseException as exc:  # handed to the awaiting episode as it is
                    outcome, failed = exc, True
            # Counted as waiting before the caller hears back, so that its next call finds this thread.
            self._waiting.release()
            if failed:
                future.set_exception(outcome)
            elif future.running():
                future.set_result(outcome)
            del call, future, fn, args, kwargs, outcome  # nothing of a finished call lives on in a waiting thread
        with self._lock:
            self._threads -= 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls; threads waiting for work end; calls still running are left to finish
        (or not) on their own, and their threads end after them."""
        self._closed = True
        with self._lock:
            threads = self._threads
        for _ in range(threads):
            self._calls.put(None)
