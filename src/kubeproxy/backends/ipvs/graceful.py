"""Graceful termination of real servers (upstream's GracefulTerminationManager), as pure
bookkeeping with the clock passed in.

A real server that is no longer wanted is deleted at once when its service is UDP or
SCTP (with ``expire_nodest_conn=1`` the kernel drops their connections on the next
packet) or when it has no connection; otherwise it gets weight 0 — existing connections
keep flowing, the scheduler sends it nothing new — and waits here. Every ``interval``
seconds (upstream: one minute) the caller reads the connection counts of the waiting
ones; each whose active + inactive count is 0, or that is gone from the kernel, is
deleted. Upstream sets no deadline: a real server with a connection that never ends
waits as long as the kernel keeps that connection (the IPVS tcp timeout). One that is
wanted again before it goes is taken off the list (the caller sets its weight back).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from kubeproxy.dataplane.ipvs import Destination, ServiceKey

CHECK_INTERVAL = 60.0  # upstream's rsCheckDeleteInterval
Item = tuple[ServiceKey, tuple[str, int]]


class Action(Enum):
    DELETE = "delete"
    QUIESCE = "weight 0"  # set weight 0 (if not already) and wait
    WAIT = "wait"  # already waiting


def needs_grace(key: ServiceKey) -> bool:
    """upstream's IsRsGracefulTerminationNeeded."""
    return key.protocol not in ("UDP", "SCTP")


@dataclass
class GracefulTermination:
    interval: float = CHECK_INTERVAL
    # item -> when it was last checked (first: when it started waiting)
    waiting: dict[Item, float] = field(default_factory=dict)

    def remove(self, key: ServiceKey, dest: Destination, now: float) -> Action:
        """``dest`` (as the kernel reports it) is no longer wanted."""
        item = (key, dest.endpoint)
        if item in self.waiting:
            return Action.WAIT
        if not needs_grace(key) or dest.connections == 0:
            return Action.DELETE
        self.waiting[item] = now
        return Action.QUIESCE

    def cancel(self, key: ServiceKey, endpoint: tuple[str, int]) -> bool:
        """The endpoint is wanted again; True if it was waiting."""
        return self.waiting.pop((key, endpoint), None) is not None

    def forget_service(self, key: ServiceKey) -> None:
        for item in [i for i in self.waiting if i[0] == key]:
            del self.waiting[item]

    def is_waiting(self, key: ServiceKey, endpoint: tuple[str, int]) -> bool:
        return (key, endpoint) in self.waiting

    def due(self, now: float) -> list[Item]:
        return sorted(i for i, last in self.waiting.items() if now - last >= self.interval)

    def settle(self, item: Item, dest: Destination | None, now: float) -> bool:
        """After a check: True if ``item`` is to be deleted (``dest``: what the kernel
        reports for it, None if it is gone, then it is simply forgotten)."""
        if dest is None:
            self.waiting.pop(item, None)
            return False
        if dest.connections == 0:
            self.waiting.pop(item, None)
            return True
        self.waiting[item] = now
        return False
