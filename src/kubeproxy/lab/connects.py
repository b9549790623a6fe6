"""New TCP connections through a Service at a steady rate, counted, from a namespace.

:class:`ConnectProbe` is what an operator watching a node during a change would see:
a client in a namespace (a Pod, the node, an outside host) opening a new connection
every ``interval`` seconds to one frontend and reading the Pod's one-line answer. Each
attempt is recorded with its outcome (the Pod that answered, or the error), so a test
can say "no connect failed while kubeproxy was replaced" and show which ones did.
Nothing is retried: the kernel's own SYN retransmission is the only second chance, as
for any client (a connect that needs it takes a second and counts as slow, not failed,
unless it exceeds ``timeout``).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

from kubeproxy.lab.echo import family_of, read_reply
from kubeproxy.lab.netns import enter_netns

# The outcome's start when the connect succeeded but the answer never came.
NO_ANSWER = "error: no answer once connected"


@dataclass(frozen=True)
class Attempt:
    at: float  # time.monotonic() when the connect started
    outcome: str  # the Pod that answered, or "error: ..."
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.outcome.startswith("error:")


@dataclass
class ConnectProbe:
    """Connect to ``host:port`` from network namespace ``netns`` every ``interval``
    seconds, in a thread, from :meth:`start` until :meth:`stop`."""

    netns: str
    host: str
    port: int
    interval: float = 0.01
    timeout: float = 3.0
    attempts: list[Attempt] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ConnectProbe:
        self._thread = threading.Thread(
            target=self._main, name=f"connects-{self.netns}", daemon=True
        )
        self._thread.start()
        return self

    def _main(self) -> None:
        enter_netns(self.netns)
        next_at = time.monotonic()
        while not self._stop.is_set():
            started = time.monotonic()
            outcome = self._ask()
            self.attempts.append(Attempt(started, outcome, time.monotonic() - started))
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def _ask(self) -> str:
        """The Pod that answered, or the error, saying whether the connect failed or
        the answer never came on an established connection (two different claims)."""
        with socket.socket(family_of(self.host), socket.SOCK_STREAM) as s:
            s.settimeout(self.timeout)
            try:
                s.connect((self.host, self.port))
            except OSError as err:
                return f"error: {type(err).__name__}: {err}"
            try:
                return read_reply(s).pod
            except OSError as err:
                return f"{NO_ANSWER}: {type(err).__name__}: {err}"

    def stop(self) -> list[Attempt]:
        """Stop and return every attempt."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 5)
        return self.attempts

    def failures(self) -> list[Attempt]:
        return [a for a in self.attempts if not a.ok]

    def answered_since(self, moment: float) -> int:
        """How many connects started at or after ``moment`` were answered."""
        return sum(1 for a in self.attempts if a.at >= moment and a.ok)

    def __enter__(self) -> ConnectProbe:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
