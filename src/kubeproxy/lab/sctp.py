"""SCTP for the lab without the kernel's SCTP stack: raw INIT packets and a raw capture.

Kernels built without the ``sctp`` module (like the one the tests run on) cannot open SCTP
sockets, but netfilter still tracks and NATs SCTP. So a client sends a hand-built SCTP
INIT chunk over a raw IP socket (protocol 132) and the endpoint captures what arrives
with another raw socket: the destination address and port it sees show where the proxy
sent the association.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

IPPROTO_SCTP = 132


def crc32c(data: bytes) -> int:
    """CRC32c (Castagnoli), the SCTP checksum (RFC 4960 appendix B)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def init_packet(src_port: int, dst_port: int, tag: int = 0x1234ABCD) -> bytes:
    """An SCTP common header plus one INIT chunk, checksummed."""
    chunk = struct.pack("!BBHIIHHI", 1, 0, 20, tag, 65535, 1, 1, 1)
    header = struct.pack("!HHII", src_port, dst_port, 0, 0)
    checksum = crc32c(header + chunk)
    return header[:8] + struct.pack("<I", checksum) + chunk


def send_init(dst_ip: str, dst_port: int, src_port: int = 40000) -> None:
    family = socket.AF_INET6 if ":" in dst_ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_RAW, IPPROTO_SCTP) as s:
        s.sendto(init_packet(src_port, dst_port), (dst_ip, 0))


@dataclass(frozen=True)
class Arrival:
    src_ip: str
    dst_ip: str
    src_port: int
    dst_port: int


def capture(timeout: float = 3.0) -> Arrival | None:
    """The first IPv4 SCTP packet that arrives in this namespace (None on timeout)."""
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, IPPROTO_SCTP) as s:
        s.settimeout(timeout)
        try:
            data, _ = s.recvfrom(4096)
        except TimeoutError:
            return None
    ihl = (data[0] & 0x0F) * 4
    src_port, dst_port = struct.unpack("!HH", data[ihl : ihl + 4])
    return Arrival(socket.inet_ntoa(data[12:16]), socket.inet_ntoa(data[16:20]), src_port, dst_port)
