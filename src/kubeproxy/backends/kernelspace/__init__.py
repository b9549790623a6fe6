"""kernelspace mode (issue 26): Services as Windows HNS load balancers.

Upstream's ``winkernel`` proxier, on the shared plan. Nothing here has run on Windows:
it is proven against the strict fake of HNS (:mod:`kubeproxy.dataplane.hns.fake`).

* :mod:`.translate` — pure: one ServicePort's plan to the load balancers it wants (which
  frontends, flags, endpoints, source VIP, remote endpoints' provider addresses).
* :mod:`.endpoints` — the network's HNS endpoints by IP, and the remote endpoints
  kube-proxy creates, shared by IP and reference-counted.
* :mod:`.proxier` — :class:`~.proxier.KernelspaceBackend`: the sync (on the shared
  :class:`~kubeproxy.backends.driver.PerFamilyDriver`), diffing what it holds against
  what the plan wants and applying it through :class:`~kubeproxy.dataplane.hns.Hns`.
* :mod:`.render` — ``kubeproxy render --proxy-mode kernelspace --hns-state FILE``: a
  full sync against a fake HNS seeded from the file, printed as the issue's JSON.
"""
