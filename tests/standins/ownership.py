"""Which attempt holds a run, as a value a test changes (a takeover): the library's fence and write
check of each attempt ask it, in place of the run's row that the platform's fence (workers.lifecycle)
locks and reads."""

from __future__ import annotations


class Ownership:
    def __init__(self, holder: int) -> None:
        self.holder = holder

    def may_write(self, attempt: int):
        return lambda: self.holder == attempt

    def fence(self, attempt: int):
        def holding(action, wait: bool) -> bool:
            if self.holder != attempt:
                return False
            action()
            return True

        return holding
