"""What one dispatch rule costs a packet (nftables mode's ``-dests`` set rules).

    ip netns add kp-bench && ip netns exec kp-bench python -m bench.dispatch_rules
    ip netns delete kp-bench

Since issue 10 part 6 the ``services`` chain tests one ``-dests`` set per shared chain in
use (``ip daddr . meta l4proto . th dport @cluster-ip-3-dests goto cluster-ip-3``), in
name order, instead of one verdict-map lookup: the first packet of a connection to a
destination whose chain sorts k-th passes k - 1 set lookups first. This measures that
price directly: TCP connects over loopback in an empty namespace, with K such rules
(none matching) in a filter output chain, which every packet of the connection passes
(SYN, ACK, FIN, ...), alternating K = 1 and larger K. Run it in a namespace of its own
(it programs a table there).
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time

from kubeproxy.dataplane.nftables.runner import LibNftables

PORT = 8080


def table(rules: int) -> str:
    lines = ["table ip dispatch-bench {"]
    for k in range(rules):
        lines.append(
            f"  set c{k} {{ type ipv4_addr . inet_proto . inet_service; "
            f"elements = {{ 10.{k // 256}.{k % 256}.1 . tcp . 80 }}; }}"
        )
        lines.append(f"  chain x{k} {{ counter; }}")
    tests = "; ".join(f"ip daddr . meta l4proto . th dport @c{k} goto x{k}" for k in range(rules))
    lines.append(f"  chain out {{ type filter hook output priority 0; {tests}; counter; }}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def connects(server: socket.socket, count: int) -> tuple[float, int]:
    """Median connect() seconds, and how many connections were made."""
    times = []
    for _ in range(count):
        with socket.socket() as s:
            started = time.perf_counter()
            s.connect(("127.0.0.1", PORT))
            times.append(time.perf_counter() - started)
            conn, _ = server.accept()
            conn.close()
    return statistics.median(times), count


def packets() -> int:
    out = subprocess.run(
        ["nft", "list", "chain", "ip", "dispatch-bench", "out"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.rsplit("counter packets ", 1)[1].split()[0])


def main(sizes: list[int], count: int = 3000) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    nft = LibNftables()
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", PORT))
        server.listen(4096)
        base: float | None = None
        for rules in [x for k in sizes for x in (1, k)]:
            nft.apply_script("table ip dispatch-bench\ndelete table ip dispatch-bench\n")
            nft.apply_script(table(rules))
            connects(server, 300)  # warm up
            median, n = connects(server, count)
            per_connection = packets() / (n + 300)
            if rules == 1:
                base = median
                print(f"{rules:>5} rules: connect median {median * 1e6:.1f} us")
                continue
            assert base is not None
            extra = (median - base) / (rules - 1) / per_connection
            print(
                f"{rules:>5} rules: connect median {median * 1e6:.1f} us, "
                f"{per_connection:.1f} packets per connection pass the chain: "
                f"{extra * 1e9:.0f} ns per rule per packet"
            )
        nft.apply_script("delete table ip dispatch-bench\n")


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]] or [16, 64, 256, 1024])
