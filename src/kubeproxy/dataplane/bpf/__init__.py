"""BPF for ``--proxy-mode ebpf``: the socket load-balancer's C source (``sock_lb.c``),
its build (:mod:`.build`), a typed ctypes layer over libbpf (:mod:`.libbpf`), and the
maps, programs and pins in the kernel (:mod:`.socklb`)."""
