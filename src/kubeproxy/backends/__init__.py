"""Proxy backends: one subpackage per proxy mode, each translating the service plan
(:mod:`kubeproxy.model.plan`) into its data plane.

* :mod:`~kubeproxy.backends.base` — the :class:`~kubeproxy.backends.base.Backend`
  interface, :class:`~kubeproxy.backends.base.SyncResult` and
  :class:`~kubeproxy.backends.base.BackendError`;
* :mod:`~kubeproxy.backends.registry` — the mode → backend and mode → cleanup tables;
* ``nftables/``, ``iptables/``, ``ipvs/``, ``ebpf/`` — the modes.

This file imports nothing, so importing a backend never loads the others.
"""
