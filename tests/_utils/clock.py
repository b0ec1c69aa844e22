"""A clock for the thermal hook that only moves when it sleeps: tests step the guard through simulated time."""

from __future__ import annotations


class ManualClock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
