"""Logging in klog's shape, so kube-proxy operators read kubeproxy logs the same way.

``I1126 02:26:26.123456   12345 proxier.py:88] message`` — severity letter, month/day,
time, pid, source file:line. ``--v`` works as in kube-proxy: 0 is the default, 2 adds
per-sync detail, 4 and above is debug output.
"""

from __future__ import annotations

import logging
import os
import sys
import time

# klog's V(2): routine per-sync detail, shown with --v=2 and above.
V2 = 15
logging.addLevelName(V2, "V2")

_LETTERS = {
    logging.DEBUG: "I",
    V2: "I",
    logging.INFO: "I",
    logging.WARNING: "W",
    logging.ERROR: "E",
    logging.CRITICAL: "F",
}


class KlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        t = time.localtime(record.created)
        micros = int((record.created - int(record.created)) * 1_000_000)
        letter = _LETTERS.get(record.levelno, "I")
        head = (
            f"{letter}{t.tm_mon:02d}{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:"
            f"{t.tm_sec:02d}.{micros:06d} {os.getpid():7d} "
            f"{record.filename}:{record.lineno}]"
        )
        text = f"{head} {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup(verbosity: int = 0, stream: object = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(KlogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    if verbosity >= 4:
        root.setLevel(logging.DEBUG)
    elif verbosity >= 2:
        root.setLevel(V2)
    else:
        root.setLevel(logging.INFO)
    # Third-party chatter (file watcher internals) only at high verbosity.
    logging.getLogger("watchfiles").setLevel(logging.DEBUG if verbosity >= 6 else logging.WARNING)
