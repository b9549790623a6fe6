"""The IPVS messages :mod:`kubeproxy.dataplane.ipvs.wire` packs, read back by pyroute2's
decoder (an independent reading of ``ip_vs.h``), and the replies pyroute2 encodes, read by
ours; the batch transport's numbering and error mapping over a socket stand-in that
answers as the kernel does. The guest tests (tests/ipvs) send them to a real IPVS."""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroute2.netlink.generic import ipvs as genl
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

from kubeproxy.dataplane.ipvs import (
    FLAG_HASHED,
    FLAG_PERSISTENT,
    FLAG_SCHED1,
    FLAG_SCHED2,
    FWD_MASQ,
    Change,
    Destination,
    Op,
    ServiceKey,
    VirtualServer,
    wire,
)

FAMILY = 0x25  # any generic-netlink family number

v4 = st.ip_addresses(v=4).map(str)
v6 = st.ip_addresses(v=6).map(str)
ports = st.integers(1, 65535)
protocols = st.sampled_from(["TCP", "UDP", "SCTP"])
schedulers = st.sampled_from(["rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "mh"])
flags = st.sets(st.sampled_from([FLAG_PERSISTENT, FLAG_SCHED1, FLAG_SCHED2])).map(sum)


@st.composite
def keys_and_dests(draw: st.DrawFn) -> tuple[ServiceKey, Destination]:
    addresses = draw(st.sampled_from([v4, v6]))
    key = ServiceKey(draw(addresses), draw(protocols), draw(ports))
    return key, Destination(draw(addresses), draw(ports), draw(st.integers(0, 65535)))


@st.composite
def changes(draw: st.DrawFn) -> Change:
    key, dest = draw(keys_and_dests())
    vs = VirtualServer(key, draw(schedulers), draw(flags), draw(st.integers(0, 86400)))
    op = draw(st.sampled_from(list(Op)))
    if op in (Op.ADD_SERVICE, Op.SET_SERVICE):
        return Change(op, key, service=vs)
    if op is Op.DELETE_SERVICE:
        return Change.delete_service(key)
    return Change(op, key, dest=dest)


def same_ip(a: str, b: str) -> bool:
    """pyroute2 writes IPv4-mapped IPv6 addresses as inet_ntop does, ipaddress otherwise."""
    return ipaddress.ip_address(a) == ipaddress.ip_address(b)


def packed(message: wire.Message, seq: int = 1) -> bytes:
    body = message.body
    return struct.pack("=IHHII", 16 + len(body), message.type, message.flags, seq, 0) + body


def pyroute2_decoded(message: wire.Message) -> Any:
    msg = genl.ipvsmsg(packed(message))
    msg.decode()
    return msg


@given(changes())
def test_pyroute2_reads_each_change_as_the_kernel_should(change: Change) -> None:
    msg = pyroute2_decoded(wire.change_message(FAMILY, change))
    assert msg["header"]["type"] == FAMILY
    assert msg["header"]["flags"] == wire.NLM_F_REQUEST
    commands = {
        Op.ADD_SERVICE: genl.IPVS_CMD_NEW_SERVICE,
        Op.SET_SERVICE: genl.IPVS_CMD_SET_SERVICE,
        Op.DELETE_SERVICE: genl.IPVS_CMD_DEL_SERVICE,
        Op.ADD_DEST: genl.IPVS_CMD_NEW_DEST,
        Op.SET_DEST: genl.IPVS_CMD_SET_DEST,
        Op.DELETE_DEST: genl.IPVS_CMD_DEL_DEST,
    }
    assert msg["cmd"] == commands[change.op] and msg["version"] == 1
    svc = msg.get_attr("IPVS_CMD_ATTR_SERVICE")
    key = change.key
    af = socket.AF_INET6 if key.v6 else socket.AF_INET
    assert svc.get_attr("IPVS_SVC_ATTR_AF") == af
    assert svc.get_attr("IPVS_SVC_ATTR_PROTOCOL") == wire.PROTO_NUMBERS[key.protocol]
    assert same_ip(svc.get_attr("IPVS_SVC_ATTR_ADDR"), key.address)
    assert svc.get_attr("IPVS_SVC_ATTR_PORT") == key.port
    if change.service is not None:
        vs = change.service
        assert svc.get_attr("IPVS_SVC_ATTR_SCHED_NAME") == vs.scheduler
        assert svc.get_attr("IPVS_SVC_ATTR_FLAGS") == {"flags": vs.flags, "mask": 0xFFFF}
        assert svc.get_attr("IPVS_SVC_ATTR_TIMEOUT") == vs.timeout
        netmask = svc.get_attr("IPVS_SVC_ATTR_NETMASK")
        # IPv6: the prefix length as a host-order u32, read by pyroute2 as an IPv4 address
        want = socket.inet_ntoa(struct.pack("=I", 128)) if key.v6 else "255.255.255.255"
        assert netmask == want
    else:
        assert svc.get_attr("IPVS_SVC_ATTR_SCHED_NAME") is None
    dest = msg.get_attr("IPVS_CMD_ATTR_DEST")
    if change.dest is None:
        assert dest is None
        return
    assert same_ip(dest.get_attr("IPVS_DEST_ATTR_ADDR"), change.dest.address)
    assert dest.get_attr("IPVS_DEST_ATTR_PORT") == change.dest.port
    daf = socket.AF_INET6 if ":" in change.dest.address else socket.AF_INET
    assert dest.get_attr("IPVS_DEST_ATTR_ADDR_FAMILY") == daf
    if change.op is Op.DELETE_DEST:
        assert dest.get_attr("IPVS_DEST_ATTR_WEIGHT") is None
    else:
        assert dest.get_attr("IPVS_DEST_ATTR_WEIGHT") == change.dest.weight
        assert dest.get_attr("IPVS_DEST_ATTR_FWD_METHOD") == FWD_MASQ  # NAT, never DR
        assert dest.get_attr("IPVS_DEST_ATTR_U_THRESH") == 0
        assert dest.get_attr("IPVS_DEST_ATTR_L_THRESH") == 0


def encoded_reply(cmd: int, attrs: list[tuple[str, Any]]) -> bytes:
    msg = genl.ipvsmsg()
    msg["cmd"] = cmd
    msg["version"] = 1
    msg["attrs"] = attrs
    msg["header"]["type"] = FAMILY
    msg.encode()
    return bytes(msg.data)[16:]


@given(keys_and_dests(), schedulers, flags, st.integers(0, 86400), st.integers(0, 1 << 20))
def test_dump_replies_as_pyroute2_encodes_them(
    pair: tuple[ServiceKey, Destination], sched: str, bits: int, timeout: int, conns: int
) -> None:
    key, dest = pair
    af = socket.AF_INET6 if key.v6 else socket.AF_INET
    service = {
        "attrs": [
            ("IPVS_SVC_ATTR_AF", af),
            ("IPVS_SVC_ATTR_PROTOCOL", wire.PROTO_NUMBERS[key.protocol]),
            ("IPVS_SVC_ATTR_ADDR", key.address),
            ("IPVS_SVC_ATTR_PORT", key.port),
            ("IPVS_SVC_ATTR_SCHED_NAME", sched),
            # The kernel reports its own hashed flag: never part of what we compare.
            ("IPVS_SVC_ATTR_FLAGS", {"flags": bits | FLAG_HASHED, "mask": 0xFFFF}),
            ("IPVS_SVC_ATTR_TIMEOUT", timeout),
        ]
    }
    payload = encoded_reply(genl.IPVS_CMD_NEW_SERVICE, [("IPVS_CMD_ATTR_SERVICE", service)])
    assert wire.parse_service(payload) == VirtualServer(key, sched, bits, timeout)
    daf = socket.AF_INET6 if ":" in dest.address else socket.AF_INET
    real = {
        "attrs": [
            ("IPVS_DEST_ATTR_ADDR", dest.address),
            ("IPVS_DEST_ATTR_ADDR_FAMILY", daf),
            ("IPVS_DEST_ATTR_PORT", dest.port),
            ("IPVS_DEST_ATTR_FWD_METHOD", FWD_MASQ),
            ("IPVS_DEST_ATTR_WEIGHT", dest.weight),
            ("IPVS_DEST_ATTR_ACTIVE_CONNS", conns),
            ("IPVS_DEST_ATTR_INACT_CONNS", conns + 1),
        ]
    }
    payload = encoded_reply(genl.IPVS_CMD_NEW_DEST, [("IPVS_CMD_ATTR_DEST", real)])
    want = Destination(dest.address, dest.port, dest.weight, conns, conns + 1)
    assert wire.parse_dest(payload, af) == want


def test_firewall_mark_services_are_skipped() -> None:
    service = {"attrs": [("IPVS_SVC_ATTR_AF", socket.AF_INET), ("IPVS_SVC_ATTR_FWMARK", 7)]}
    payload = encoded_reply(genl.IPVS_CMD_NEW_SERVICE, [("IPVS_CMD_ATTR_SERVICE", service)])
    assert wire.parse_service(payload) is None


@given(st.booleans(), st.integers(1, 1 << 20), st.sampled_from([v4, v6]).flatmap(lambda s: s))
def test_address_messages_read_back_by_pyroute2(add: bool, index: int, address: str) -> None:
    message = wire.address_message(add, index, address)
    msg = ifaddrmsg(packed(message))
    msg.decode()
    assert msg["header"]["type"] == (wire.RTM_NEWADDR if add else wire.RTM_DELADDR)
    assert msg["index"] == index and msg["prefixlen"] == (128 if ":" in address else 32)
    assert same_ip(msg.get_attr("IFA_ADDRESS"), address)
    assert same_ip(msg.get_attr("IFA_LOCAL"), address)
    assert wire.parse_address(packed(message)[16:]) == (index, address)
    assert wire.address_index(packed(message)[16:]) == index


@pytest.mark.parametrize(
    ("local", "peer"), [("10.244.1.1", "10.244.1.11"), ("fd00:10:244:1::1", "fd00:10:244:1::b")]
)
def test_a_point_to_point_address_is_its_local_end(local: str, peer: str) -> None:
    """``ip addr add LOCAL peer PEER`` (a Pod's veth, as the lab and some network
    plugins set it up): the node's address is IFA_LOCAL, IFA_ADDRESS is the Pod's."""
    af = socket.AF_INET6 if ":" in local else socket.AF_INET
    bits = 128 if af == socket.AF_INET6 else 32
    body = struct.pack("=BBBBI", af, bits, 0, 0, 7)
    body += wire._attr(wire.IFA_ADDRESS, socket.inet_pton(af, peer))
    body += wire._attr(wire.IFA_LOCAL, socket.inet_pton(af, local))
    assert wire.parse_address(body) == (7, local)


class KernelStandIn:
    """Answers as netlink does: an error answer for each refused request (``refuse``:
    sequence numbers), an acknowledgement for a request that asks for one."""

    def __init__(self, refuse: set[int]) -> None:
        self.refuse = refuse
        self.sent: list[list[tuple[int, int]]] = []  # per send: (sequence, flags)
        self.answers: list[bytes] = []

    def setsockopt(self, *args: object) -> None:
        pass

    def settimeout(self, seconds: float) -> None:
        pass

    def send(self, data: bytes) -> int:
        got = []
        reply = b""
        for _, flags, seq, _ in wire.split(data):
            got.append((seq, flags))
            code = errno.EEXIST if seq in self.refuse else 0
            if code or flags & wire.NLM_F_ACK:
                head = struct.pack("=IHHII", 36, 1, 0, seq, 0)  # the request's header
                reply += struct.pack("=IHHIIi", 36, wire.NLMSG_ERROR, 0, seq, 0, -code) + head
        self.sent.append(got)
        self.answers.append(reply)
        return len(data)

    def recv(self, size: int) -> bytes:
        return self.answers.pop(0)


def test_batch_maps_each_refusal_to_its_message_and_asks_one_ack_per_chunk() -> None:
    count = wire.CHUNK * 2 + 5
    messages = [wire.change_message(FAMILY, Change.delete_service(ServiceKey("10.0.0.1", "TCP", p)))
                for p in range(1, count + 1)]  # fmt: skip
    refuse = {3, wire.CHUNK, wire.CHUNK + 1, count}
    kernel = KernelStandIn(refuse)
    batch = wire.Batch(kernel)  # type: ignore[arg-type]
    codes = batch.run(messages)
    assert [i + 1 for i, c in enumerate(codes) if c] == sorted(refuse)
    assert set(codes) == {0, errno.EEXIST}
    assert batch.sends == len(kernel.sent) == 3
    for chunk in kernel.sent:
        asked = [seq for seq, flags in chunk if flags & wire.NLM_F_ACK]
        assert asked == [chunk[-1][0]]
    # Numbering goes on across calls; a stale answer would not be taken for a new one.
    assert batch.run(messages[:1]) == [0] and kernel.sent[-1] == [(count + 1, 5)]
