"""Go's ``time.Duration`` as the v1alpha1 file and the flags write it.

:class:`Duration` is parsed and printed exactly as Go does (``"1m30s"``, ``"24h0m0s"``,
``"500ms"``) and kept as integer nanoseconds, so a round trip is exact (upstream:
apimachinery's ``metav1.Duration`` over ``time.ParseDuration`` / ``Duration.String``).
:func:`go_quote` quotes a string as Go's ``%q`` does, for messages in Go's words.

A module of its own rather than part of :mod:`.codec`: the types (:mod:`.types`), the
decoder (:mod:`.codec`), validation and flags all use it, and the codec imports the types.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_INT64_MAX = 2**63 - 1


_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_COMPONENT = re.compile(r"(\d*)(?:\.(\d*))?([^\d.]*)")


@dataclass(frozen=True, order=True, slots=True)
class Duration:
    """A Go ``time.Duration`` (integer nanoseconds)."""

    nanoseconds: int = 0

    @classmethod
    def of_seconds(cls, seconds: float) -> Duration:
        return cls(round(seconds * 1_000_000_000))

    @property
    def seconds(self) -> float:
        return self.nanoseconds / 1_000_000_000

    def __bool__(self) -> bool:
        return self.nanoseconds != 0

    @classmethod
    def parse(cls, text: str) -> Duration:
        """``time.ParseDuration``: ``[-+]`` then one or more ``<number><unit>``, or ``0``."""
        rest = text
        negative = False
        if rest[:1] in ("-", "+"):
            negative = rest[0] == "-"
            rest = rest[1:]
        if rest == "0":
            return cls(0)
        if not rest:
            raise ValueError(f"time: invalid duration {go_quote(text)}")
        total = 0
        while rest:
            match = _COMPONENT.match(rest)
            assert match is not None  # the pattern matches any string, possibly empty
            whole, frac, unit = match.group(1), match.group(2), match.group(3)
            if not whole and not frac:
                raise ValueError(f"time: invalid duration {go_quote(text)}")
            if not unit:
                raise ValueError(f"time: missing unit in duration {go_quote(text)}")
            if unit not in _NS:
                raise ValueError(
                    f"time: unknown unit {go_quote(unit)} in duration {go_quote(text)}"
                )
            scale = _NS[unit]
            total += int(whole or "0") * scale
            if frac:
                total += int(frac) * scale // 10 ** len(frac)
            if total > _INT64_MAX + (1 if negative else 0):
                raise ValueError(f"time: invalid duration {go_quote(text)}")
            rest = rest[match.end() :]
        return cls(-total if negative else total)

    def __str__(self) -> str:
        """``Duration.String()``: ``0s``, ``1.5ms``, ``30s``, ``1m30s``, ``24h0m0s``."""
        ns = abs(self.nanoseconds)
        sign = "-" if self.nanoseconds < 0 else ""
        if ns == 0:
            return "0s"
        if ns < _NS["s"]:
            for unit, scale in (("ms", _NS["ms"]), ("\u00b5s", _NS["us"]), ("ns", 1)):
                if ns >= scale:
                    return sign + _decimal(ns, scale) + unit
        hours, rem = divmod(ns, _NS["h"])
        minutes, rem = divmod(rem, _NS["m"])
        out = _decimal(rem, _NS["s"]) + "s"
        if hours or minutes:
            out = f"{minutes}m" + out
        if hours:
            out = f"{hours}h" + out
        return sign + out


def _decimal(value: int, scale: int) -> str:
    whole, frac = divmod(value, scale)
    if not frac:
        return str(whole)
    digits = len(str(scale)) - 1
    return f"{whole}." + f"{frac:0{digits}d}".rstrip("0")


def go_quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
