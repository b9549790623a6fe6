"""``--proxy-mode ebpf`` (ours, not upstream's): socket load-balancing for ClusterIPs
(:mod:`.render`: plan → BPF map entries; :mod:`.proxier`: the backend, which runs the
nftables backend beside it for everything the socket hooks do not serve). See
docs/ebpf.md."""
