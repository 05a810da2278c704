"""The service's CPU budget for ONNX Runtime runs: one run on every intra-op thread, or several single-thread runs.

Two runs at once, each on one thread, never wait for each other, while a 2-thread run stalls when the event loop
preempts one of its threads; a lone run still finishes sooner on every thread (docs/serving.md, "Parallel runs").
So `RunSlots` hands out `slots` tokens (the intra-op threads): a run made while every slot is free, nobody else
waits and its graph has no more work coming (nothing queued, no batch being gathered, and no request in progress
in the service beyond the run's own) takes them all and runs on the wide session; a run made under load takes one
slot and runs on a narrow (single-thread) session. The requests in progress (`Activity`, counted by the HTTP and
gRPC front ends) catch what the queue cannot see: requests still being read and decoded. One `RunSlots` serves
every graph of the service.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def _never() -> bool:
    return False


class Activity:
    """How many requests the service is handling: HTTP requests from their first ASGI event to their answer (every
    route, and an upload while its body streams in), gRPC calls while their handler runs."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return self._count

    @contextmanager
    def request(self) -> Iterator[None]:
        """Count one request while the block runs."""
        with self._lock:
            self._count += 1
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1


class RunSlots:
    """`slots` single-thread runs at once, or one run on all of them; `slots` 1 makes the runs take turns."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self._free = slots
        self._waiting = 0  # runs waiting for slots
        self._waiting_wide = 0  # of which need every slot (their graph has no narrow session)
        self._changed = threading.Condition()
        self.activity = Activity()  # the service's requests in progress: the batchers read it in `more_work`

    @property
    def free(self) -> int:
        return self._free

    def quiet(self) -> bool:
        """No run holds or awaits a slot and no request is in progress beyond the asker's own (a hint, read
        unlocked): an event loop may run a lone request itself without waiting for a slot."""
        return self._free == self.slots and not self._waiting and self.activity.count <= 1

    @contextmanager
    def run(self, can_narrow: bool, more_work: Callable[[], bool] = _never) -> Iterator[bool]:
        """Hold slots for one run; yields True for a wide run (every slot: use the wide session), else False.

        `can_narrow` False: the graph has no single-thread session (one slot budget, or a GPU), so the run waits
        for every slot. A run that needs them all is not starved: while it waits, narrow runs take no new slot.
        `more_work`: whether there is work beyond this run (its graph's queued requests or a batch being gathered,
        or other requests in progress in the service); read each time the slots are checked, it keeps the runs of a
        loaded service narrow.
        """
        with self._changed:
            take = self._acquire(can_narrow, more_work)
        try:
            yield take == self.slots
        finally:
            with self._changed:
                self._free += take
                self._changed.notify_all()

    def _acquire(self, can_narrow: bool, more_work: Callable[[], bool]) -> int:
        """Wait (holding `_changed`) for the slots of one run; returns how many were taken."""
        self._waiting += 1
        self._waiting_wide += not can_narrow
        try:
            while True:
                if self._free == self.slots and (not can_narrow or (self._waiting == 1 and not more_work())):
                    take = self.slots  # alone: the whole budget
                    break
                if can_narrow and self._free and not self._waiting_wide:
                    take = 1
                    break
                self._changed.wait()
        finally:
            self._waiting -= 1
            self._waiting_wide -= not can_narrow
        self._free -= take
        return take
