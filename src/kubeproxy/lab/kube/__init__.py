"""A real Kubernetes control plane in the lab: upstream's own binaries as the oracle.

Map:

* :mod:`.binaries` — where the upstream binaries are (``scripts/build-upstream`` builds
  kube-apiserver, kube-controller-manager, kube-proxy and kubectl from the Go module
  proxy, and installs etcd from PyPI, into a cache);
* :mod:`.pki` — the cluster's certificates and service-account keys (openssl);
* :mod:`.api` — a small synchronous client of the API server, run from a thread inside a
  network namespace (the lab's addresses exist only there);
* :mod:`.controlplane` — etcd, kube-apiserver (TLS, RBAC, ServiceCIDR/IPAddress
  allocation) and kube-controller-manager (EndpointSlice, EndpointSliceMirroring,
  ServiceCIDR, service accounts, garbage collection) in a network namespace of their own;
  also alone, with ranges and flags of its own (``lone_control_plane``);
* :mod:`.cluster` — several nodes as network namespaces on a bridge, Pods as namespaces
  behind their node (real Pod objects whose status the lab sets, as no kubelet runs),
  Node objects with zones and allocatable CPU, and kubeproxy (or upstream kube-proxy) on
  every node with the credentials of deploy/'s ServiceAccount;
* :mod:`.migration` — upstream's kube-proxy on a node with kubeadm's identity for it, and
  what a node's kernel holds for each proxy, compared (who has taken the node over, and
  what the previous proxy left that nothing reaches);
* :mod:`.allocparity` / :mod:`.hintparity` — kubeproxy.controlplane with the real
  components as the oracle: the same Service requests to kube-apiserver's allocators and
  to ours; the same random clusters to kube-controller-manager's EndpointSlice controller
  and to ours (tests/realk8s/test_controlplane_parity.py, bench/controlplane_parity.py); the
  allocation check's pieces are :mod:`.allocsides` and :mod:`.allocscenario`.
"""
