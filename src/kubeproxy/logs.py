"""Logging in kube-proxy's two formats (``--logging-format`` / ``logging.format``).

* ``text`` (the default) is klog's shape, so kube-proxy operators read kubeproxy logs
  the same way: ``I1126 02:26:26.123456   12345 proxier.py:88] message`` — severity
  letter, month/day, time, pid, source file:line (:class:`KlogFormatter`).
* ``json`` is component-base's zap-based JSON logger (``logs/json``), one object per line
  (:class:`JsonFormatter`)::

      {"ts":1700000000123.456,"caller":"kubeproxy/app.py:88","msg":"Synced","v":0}
      {"ts":1700000000124.789,"caller":"health/services.py:140","msg":"...","err":"..."}

  ``ts`` is milliseconds since the epoch as a float (upstream's epochMillisTimeEncoder),
  ``caller`` is the last directory and file:line (zap's ShortCallerEncoder), ``v`` the
  verbosity of an info line, and an error line has no ``v`` but ``err`` (the
  exception's text) when there is one, as zapr writes them. Structured key/values
  passed as ``extra={...}`` follow, after ``v``. Ours: an exception's traceback goes in
  ``stacktrace`` (upstream's Go errors carry none).

A line stays under 4 KiB (container runtimes split longer lines and log shippers cut
them): messages say counts and the first few names, and :func:`bounded` cuts whatever
would still be longer, saying how much it left out.

``--v`` works as in kube-proxy: 0 is the default, 2 adds per-sync detail (:data:`V2`), 4
and above is debug output. :func:`set_verbosity` changes it at run time (the metrics
server's ``PUT /debug/flags/v``). ``--vmodule`` / ``logging.vmodule`` raise it for some
source files, as klog's: ``proxier=4,kube*=2`` matches a file's name without ``.py``
(glob), a pattern with a ``/`` the end of its path. Both formats write to stderr, as
upstream's.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

# klog's V(2): routine per-sync detail, shown with --v=2 and above.
V2 = 15
logging.addLevelName(V2, "V2")

FORMATS = ("text", "json")

_LETTERS = {
    logging.DEBUG: "I",
    V2: "I",
    logging.INFO: "I",
    logging.WARNING: "W",
    logging.ERROR: "E",
    logging.CRITICAL: "F",
}

# The klog verbosity a Python level stands for (what JSON's "v" says).
_VERBOSITY = {V2: 2, logging.DEBUG: 4}

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


# A message longer than this is cut (see bounded): with klog's header, or JSON's fields
# and escapes, the line stays under 4 KiB.
MESSAGE_LIMIT = 3000


def bounded(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """``message``, or its first ``limit`` characters and how many more there were."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... [{len(message) - limit} more characters]"


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
        text = f"{head} {bounded(record.getMessage())}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record, in component-base's JSON log schema."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": record.created * 1000.0,
            "caller": _short_caller(record.pathname, record.lineno),
            "msg": bounded(record.getMessage()),
        }
        error = record.levelno >= logging.ERROR
        if not error:
            entry["v"] = _VERBOSITY.get(record.levelno, 0)
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            entry.setdefault("err", bounded(str(record.exc_info[1])))
            entry["stacktrace"] = self.formatException(record.exc_info)
        err = entry.get("err")
        if err is not None and not isinstance(err, str):
            entry["err"] = bounded(str(err))  # an exception passed as extra={"err": exc}
        return json.dumps(entry, ensure_ascii=False, default=str, separators=(",", ":"))


def _short_caller(pathname: str, lineno: int) -> str:
    """zap's ShortCallerEncoder: ``dir/file:line`` (the last directory only)."""
    parent, name = os.path.split(pathname)
    directory = os.path.basename(parent)
    return f"{directory}/{name}:{lineno}" if directory else f"{name}:{lineno}"


def setup(
    verbosity: int = 0,
    stream: TextIO | None = None,
    fmt: str = "text",
    vmodule: Sequence[tuple[str, int]] = (),
) -> None:
    """Log to ``stream`` (stderr) in format ``fmt`` at klog verbosity ``verbosity``,
    raised to ``N`` for the source files each ``(pattern, N)`` of ``vmodule`` matches."""
    if fmt not in FORMATS:
        raise ValueError(f"unsupported log format {fmt!r} (supported: {', '.join(FORMATS)})")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KlogFormatter())
    handler.addFilter(_VMODULE)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    _VMODULE.rules = tuple((pattern, _level(v)) for pattern, v in vmodule)
    set_verbosity(verbosity)


def _level(verbosity: int) -> int:
    if verbosity >= 4:
        return logging.DEBUG
    return V2 if verbosity >= 2 else logging.INFO


class _VModuleFilter(logging.Filter):
    """Lets a record below the global verbosity through when its file matches a rule."""

    def __init__(self) -> None:
        super().__init__()
        self.level = logging.INFO
        self.rules: tuple[tuple[str, int], ...] = ()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.level:
            return True
        path = os.path.splitext(record.pathname)[0]
        for pattern, level in self.rules:
            name = path if "/" in pattern else os.path.basename(path)
            if record.levelno >= level and (
                fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, "*/" + pattern)
            ):
                return True
        return False


_VMODULE = _VModuleFilter()


def set_verbosity(verbosity: int) -> None:
    """klog's ``-v``: which records pass, from now on (handlers stay as they are)."""
    _VMODULE.level = _level(verbosity)
    # Records are made down to the lowest level a vmodule rule wants; the filter decides.
    lowest = min([_VMODULE.level, *(level for _, level in _VMODULE.rules)])
    logging.getLogger().setLevel(lowest)
    # Third-party chatter (file watcher internals) only at high verbosity.
    logging.getLogger("watchfiles").setLevel(logging.DEBUG if verbosity >= 6 else logging.WARNING)
