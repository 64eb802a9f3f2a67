"""The daemon thread pool that runs blocking user code (training/threads.py): threads are reused, a
call that never returns keeps only its own thread, and shutdown leaves nothing waiting."""

from __future__ import annotations

import threading

import pytest

from training.threads import DaemonThreadExecutor


def named_threads(name: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == name]


def test_calls_one_after_another_reuse_one_thread():
    executor = DaemonThreadExecutor("reuse-test")
    seen = {executor.submit(threading.get_ident).result(timeout=5) for _ in range(50)}
    assert len(seen) == 1
    assert len(named_threads("reuse-test")) == 1
    executor.shutdown()


def test_a_stuck_call_keeps_its_thread_and_the_others_go_on():
    executor = DaemonThreadExecutor("stuck-test")
    release = threading.Event()
    stuck = executor.submit(release.wait)
    results = [executor.submit(lambda n=n: n * n).result(timeout=5) for n in range(20)]
    assert results == [n * n for n in range(20)]
    assert not stuck.done()
    assert len(named_threads("stuck-test")) == 2  # the stuck one, and one for everything else
    executor.shutdown(wait=True)  # returns at once: nobody waits for the stuck call
    release.set()
    assert stuck.result(timeout=5) is True


def test_concurrent_calls_get_threads_of_their_own():
    executor = DaemonThreadExecutor("concurrent-test")
    barrier = threading.Barrier(4, timeout=5)
    futures = [executor.submit(barrier.wait) for _ in range(4)]  # each waits for the other three
    assert sorted(f.result(timeout=5) for f in futures) == [0, 1, 2, 3]
    executor.shutdown()


def test_exceptions_reach_the_caller_and_shutdown_ends_the_waiting_threads():
    executor = DaemonThreadExecutor("shutdown-test")
    with pytest.raises(ZeroDivisionError):
        executor.submit(lambda: 1 / 0).result(timeout=5)
    assert executor.submit(str, 7).result(timeout=5) == "7"
    threads = named_threads("shutdown-test")
    executor.shutdown()
    for thread in threads:
        thread.join(timeout=5)
        assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(str, 1)
