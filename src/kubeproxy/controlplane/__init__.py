"""The control-plane side of Services, as a pure library (no API server, no I/O).

What kube-apiserver and kube-controller-manager compute for Services, with upstream's
rules, so that kubeproxy's tools (and tests) can produce ClusterIPs, NodePorts and
EndpointSlices exactly as a cluster would:

* :mod:`.ipallocator` — ClusterIP allocation: static/dynamic bands
  (:func:`~.ipallocator.calculate_range_offset`), one CIDR (:class:`~.ipallocator.Allocator`),
  every ServiceCIDR of a family (:class:`~.ipallocator.MetaAllocator`), dual stack
  (:class:`~.ipallocator.ClusterIPAllocator`), the legacy bitmap
  (:class:`~.ipallocator.BitmapAllocator`), and the errors.
* :mod:`.portallocator` — NodePort and healthCheckNodePort allocation from
  ``--service-node-port-range``.
* :mod:`.endpointslice` — the EndpointSlice controller's reconciler: Pods to slices.
* :mod:`.topologycache` — ``service.kubernetes.io/topology-mode: Auto`` zone hints.
* :mod:`.trafficdist` — hints for ``spec.trafficDistribution``.
* :mod:`.shapes` — the raw objects the standalone control plane reads, checked for the
  types and ranges of those fields first (one log line and absent when wrong).
* ``_bands`` / ``_slices`` — internals shared by the above (the two-band scan and bitmap;
  copy-on-write for slice dicts).

Objects go in and come out as plain dicts in Kubernetes JSON form. Randomness is an
injected :class:`random.Random`, time an argument; nothing reads a clock or global state.
See docs/controlplane.md.
"""
