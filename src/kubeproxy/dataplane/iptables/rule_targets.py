"""The targets of the iptables rule language (see :mod:`.rules`): ``-j NAME`` and its
options.

``_Target`` adds to an extension the table it belongs to and the builtin chains it may
run from (checked by the kernel at commit). Verdicts (``ACCEPT``, ``DROP``,
``RETURN``), ``DNAT``, ``MASQUERADE``, ``MARK`` and ``REJECT``; :data:`TARGETS` maps
their names, :data:`RESERVED_CHAIN_NAMES` the names a chain may not take.
"""

from __future__ import annotations

import re
from typing import ClassVar

from kubeproxy.dataplane.iptables.rule_matches import (
    _Context,
    _Extension,
    _opts,
)
from kubeproxy.dataplane.iptables.rule_values import (
    PORT_PROTOCOLS,
    U32_MAX,
    RuleError,
    parse_address,
    parse_port_range,
    parse_value_mask,
    port_range_text,
)
from kubeproxy.model.types import IPFamily


class _Target(_Extension):
    # The only table the target may be used in, and the builtin chains it may run from
    # (None: any); checked by the kernel.
    table: ClassVar[str | None] = None
    hooks: ClassVar[frozenset[str] | None] = None


class _Verdict(_Target):
    def finish(self) -> str:
        return ""


class _Accept(_Verdict):
    name = "ACCEPT"


class _Drop(_Verdict):
    name = "DROP"


class _Return(_Verdict):
    name = "RETURN"


def _needs_port_protocol(ctx: _Context) -> None:
    if ctx.port_protocol() not in PORT_PROTOCOLS:
        raise RuleError("Need TCP, UDP, SCTP or DCCP with port specification")


class _Dnat(_Target):
    name = "DNAT"
    options = _opts(
        ("--to-destination", "to-destination", True, False),
        ("--random", "random", False, False),
        ("--persistent", "persistent", False, False),
    )
    table = "nat"
    hooks = frozenset({"PREROUTING", "OUTPUT"})

    def _destination(self, text: str) -> str:
        if self.ctx.family is IPFamily.IPv6:
            m = re.match(r"^\[([^\]]+)\](?::(.+))?$", text)
            addr, ports = (m.group(1), m.group(2)) if m else (text, None)
        else:
            addr, sep, rest = text.partition(":")
            ports = rest if sep else None
        if "-" in addr:
            raise RuleError("DNAT: address ranges are not modelled")
        addr = parse_address(addr, self.ctx.family)
        if ports is None:
            return addr
        _needs_port_protocol(self.ctx)
        first, last = parse_port_range(ports, "-")
        port_text = port_range_text(first, last, "-")
        return (
            f"[{addr}]:{port_text}" if self.ctx.family is IPFamily.IPv6 else f"{addr}:{port_text}"
        )

    def finish(self) -> str:
        self.require("to-destination")
        out = f" --to-destination {self._destination(self.value('to-destination'))}"
        for flag in ("random", "persistent"):
            if self.has(flag):
                out += f" --{flag}"
        return out


class _Masquerade(_Target):
    name = "MASQUERADE"
    options = _opts(
        ("--to-ports", "to-ports", True, False),
        ("--random", "random", False, False),
        ("--random-fully", "random-fully", False, False),
    )
    table = "nat"
    hooks = frozenset({"POSTROUTING"})

    def finish(self) -> str:
        out = ""
        if self.has("to-ports"):
            _needs_port_protocol(self.ctx)
            first, last = parse_port_range(self.value("to-ports"), "-")
            out += f" --to-ports {port_range_text(first, last, '-')}"
        if self.has("random"):
            out += " --random"
        if self.has("random-fully"):
            if not self.ctx.random_fully:
                raise RuleError('unknown option "--random-fully"')
            out += " --random-fully"
        return out


class _MarkTarget(_Target):
    name = "MARK"
    options = _opts(
        ("--set-xmark", "set-xmark", True, False),
        ("--set-mark", "set-mark", True, False),
        ("--and-mark", "and-mark", True, False),
        ("--or-mark", "or-mark", True, False),
        ("--xor-mark", "xor-mark", True, False),
    )

    def finish(self) -> str:
        key = self.exclusive("set-xmark", "set-mark", "and-mark", "or-mark", "xor-mark")
        if key is None:
            raise RuleError(
                "MARK: One of the --set-xmark, --{and,or,xor,set}-mark options is required"
            )
        value, mask = parse_value_mask(self.value(key))
        if key in ("and-mark", "or-mark", "xor-mark") and mask is not None:
            raise RuleError(f"MARK: --{key} takes no mask")
        # libxt_MARK turns every form into --set-xmark value/mask.
        if key == "set-xmark":
            mark, xmask = value, U32_MAX if mask is None else mask
        elif key == "set-mark":
            mark, xmask = value, value | (U32_MAX if mask is None else mask)
        elif key == "and-mark":
            mark, xmask = 0, ~value & U32_MAX
        elif key == "or-mark":
            mark, xmask = value, value
        else:
            mark, xmask = value, 0
        return f" --set-xmark {mark:#x}/{xmask:#x}"


_REJECT_TYPES = {
    IPFamily.IPv4: {
        "icmp-net-unreachable": "net-unreach",
        "icmp-host-unreachable": "host-unreach",
        "icmp-port-unreachable": "port-unreach",
        "icmp-proto-unreachable": "proto-unreach",
        "icmp-net-prohibited": "net-prohib",
        "icmp-host-prohibited": "host-prohib",
        "icmp-admin-prohibited": "admin-prohib",
        "tcp-reset": "tcp-rst",
    },
    IPFamily.IPv6: {
        "icmp6-no-route": "no-route",
        "icmp6-adm-prohibited": "adm-prohibited",
        "icmp6-addr-unreachable": "addr-unreach",
        "icmp6-port-unreachable": "port-unreach",
        "icmp6-policy-fail": "policy-fail",
        "icmp6-reject-route": "reject-route",
        "tcp-reset": "tcp-rst",
    },
}


class _Reject(_Target):
    name = "REJECT"
    options = _opts(("--reject-with", "reject-with", True, False))
    table = "filter"
    hooks = frozenset({"INPUT", "FORWARD", "OUTPUT"})

    def finish(self) -> str:
        types = _REJECT_TYPES[self.ctx.family]
        if self.has("reject-with"):
            given = self.value("reject-with")
            found = next((t for t, alias in types.items() if given in (t, alias)), None)
            if found is None:
                raise RuleError(f'unknown reject type "{given}"')
        else:
            found = next(t for t in types if t.endswith("port-unreachable"))
        if found == "tcp-reset" and self.ctx.port_protocol() != "tcp":
            self.ctx.kernel_errors.append("REJECT --reject-with tcp-reset needs -p tcp")
        return f" --reject-with {found}"


TARGETS: dict[str, type[_Target]] = {
    cls.name: cls for cls in (_Accept, _Drop, _Return, _Dnat, _Masquerade, _MarkTarget, _Reject)
}
# Names a chain may not take: the standard targets (iptables refuses them, "File
# exists") and the extensions modelled here (iptables allows a chain named DNAT, which
# then shadows the target; refused, so a rule's meaning never depends on the state).
RESERVED_CHAIN_NAMES = frozenset({"ACCEPT", "DROP", "QUEUE", "RETURN"} | set(TARGETS))
