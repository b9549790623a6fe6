"""etcd, kube-apiserver and kube-controller-manager in one network namespace.

The API server serves TLS on ``address:6443`` (and 127.0.0.1) with RBAC on, client
certificates from the lab's CA, service-account tokens signed by the lab's key, and the
Service ranges given (a default ServiceCIDR and IPAddress objects, as any 1.33+ server).
The controller manager runs the controllers a Service needs without a kubelet:
EndpointSlice, EndpointSliceMirroring, ServiceCIDR, ServiceAccount (the admission plugin
wants each namespace's ``default`` account), garbage collection (EndpointSlices go with
their Service) and namespaces. Each component can be stopped and started again
(:meth:`ControlPlane.stop` / :meth:`ControlPlane.start`) for fault tests; etcd can be
compacted (a watch then resumes with 410 Gone).

:func:`lone_control_plane` runs one alone, in a namespace of its own with no bridge and no
nodes, with its own ranges and flags (``extra_args``): for tests of the control plane
itself, where only the API server's and the controllers' answers matter.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kubeproxy.lab.cluster import spawn, stop_process
from kubeproxy.lab.kube.api import Api, ApiError
from kubeproxy.lab.kube.binaries import Binaries
from kubeproxy.lab.kube.pki import Pair, Pki
from kubeproxy.lab.netns import NetnsExecutor, add_netns, delete_netns, sh
from kubeproxy.lab.uml import in_guest

API_PORT = 6443
ETCD = "http://127.0.0.1:2379"
CONTROLLERS = (
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "service-cidr-controller",
    "serviceaccount-controller",
    "garbage-collector-controller",
    "namespace-controller",
)
READY_TIMEOUT = 120.0
# Inside the user-mode-Linux guest everything shares one slow CPU: its API server once
# stayed unready ("readyz check failed") past 120 s at the start of CI's ipvs
# differential test, and passed on the next two runs.
GUEST_READY_TIMEOUT = 300.0


def kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    *,
    client: Pair | None = None,
    token: str | None = None,
) -> Path:
    user: dict[str, str] = {}
    if client is not None:
        user = {"client-certificate": str(client.cert), "client-key": str(client.key)}
    if token is not None:
        user = {"token": token}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "lab", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "user"}}],
        "current-context": "lab",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass
class ControlPlane:
    netns: str
    address: str  # on the lab's bridge: where nodes reach the API server
    workdir: Path
    binaries: Binaries
    service_cidrs: Sequence[str] = ("10.96.0.0/16", "fd00:10:96::/112")
    # The first ClusterIP (the "kubernetes" Service's), for the serving certificate.
    kubernetes_ips: Sequence[str] = ("10.96.0.1", "fd00:10:96::1")
    pki: Pki | None = None
    # More flags per component (``{"kube-apiserver": ["--service-node-port-range", ...]}``),
    # for a control plane configured unlike the session's.
    extra_args: Mapping[str, Sequence[str]] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    _executor: NetnsExecutor | None = None

    @property
    def server(self) -> str:
        return f"https://{self.address}:{API_PORT}"

    @property
    def executor(self) -> NetnsExecutor:
        if self._executor is None:
            self._executor = NetnsExecutor(self.netns)
        return self._executor

    def certificates(self) -> Pki:
        if self.pki is None:
            self.pki = Pki.create(self.workdir / "pki", [self.address, *self.kubernetes_ips])
        return self.pki

    def api(self) -> Api:
        """The admin (system:masters), from inside the control plane's namespace."""
        pki = self.certificates()
        return Api(self.executor, "127.0.0.1", API_PORT, pki.ca.cert, client=pki.admin)

    def admin_kubeconfig(self) -> Path:
        pki = self.certificates()
        return kubeconfig(
            self.workdir / "admin.kubeconfig", self.server, pki.ca.cert, client=pki.admin
        )

    # ----------------------------------------------------------------- processes

    def up(self) -> None:
        """Start every component and wait until the API server is ready and the
        controllers run (the default namespace has its service account)."""
        self.certificates()
        for name in ("etcd", "kube-apiserver"):
            self.start(name)
        # The controller manager gives up when the API server is not healthy within its
        # own fixed wait, which a slow machine (the user-mode-Linux guest) overruns.
        self.wait_ready(service_account=False)
        self.start("kube-controller-manager")
        self.wait_ready()

    def command(self, name: str) -> list[str]:
        pki = self.certificates()
        b = self.binaries
        if name == "etcd":
            data = self.workdir / "etcd"
            return [
                b.etcd, "--name", "lab", "--data-dir", str(data),
                "--listen-client-urls", ETCD, "--advertise-client-urls", ETCD,
                "--listen-peer-urls", "http://127.0.0.1:2380",
                "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                "--initial-cluster", "lab=http://127.0.0.1:2380",
                "--unsafe-no-fsync", "--log-level", "warn",
            ]  # fmt: skip
        if name == "kube-apiserver":
            return [
                b.apiserver, "--etcd-servers", ETCD,
                "--bind-address", "0.0.0.0", "--secure-port", str(API_PORT),
                "--advertise-address", self.address,
                "--tls-cert-file", str(pki.apiserver.cert),
                "--tls-private-key-file", str(pki.apiserver.key),
                "--client-ca-file", str(pki.ca.cert),
                "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
                "--service-account-key-file", str(pki.sa_pub),
                "--service-account-signing-key-file", str(pki.sa_key),
                "--service-cluster-ip-range", ",".join(self.service_cidrs),
                "--authorization-mode", "RBAC",
                # As kubeadm and kind: DaemonSets with a privileged container (upstream
                # kube-proxy's, deploy/'s init container) are admitted.
                "--allow-privileged=true",
                "--cert-dir", str(self.workdir / "apiserver-certs"),
                "--enable-priority-and-fairness=false", "--profiling=false",
                "--v=1",
            ]  # fmt: skip
        if name == "kube-controller-manager":
            kcm = kubeconfig(
                self.workdir / "kcm.kubeconfig",
                f"https://127.0.0.1:{API_PORT}",
                pki.ca.cert,
                client=pki.controller_manager,
            )
            return [
                b.controller_manager, "--kubeconfig", str(kcm),
                "--leader-elect=false", "--controllers", ",".join(CONTROLLERS),
                # As kubeadm: each controller as its own ServiceAccount, with the
                # bootstrap RBAC roles upstream gives it.
                "--use-service-account-credentials=true",
                "--bind-address", "127.0.0.1", "--secure-port", "10257",
                "--v=1",
            ]  # fmt: skip
        raise ValueError(f"no component {name!r}")

    def start(self, name: str) -> None:
        command = [
            "ip", "netns", "exec", self.netns,
            *self.command(name), *self.extra_args.get(name, ()),
        ]  # fmt: skip
        self.procs[name] = spawn(command, self.workdir / f"{name}.log", "a")

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop_process(proc)

    def running(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def wait_ready(self, timeout: float | None = None, *, service_account: bool = True) -> None:
        """Until the API server is ready and (``service_account``) the controllers run:
        the default namespace has its ServiceAccount."""
        if timeout is None:
            timeout = GUEST_READY_TIMEOUT if in_guest() else READY_TIMEOUT
        api = self.api()
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited: {self.log_tail(name)}")
            try:
                api.request("GET", "/readyz")
                if service_account:
                    api.get("ServiceAccount", "default", "default")
                return
            except (ApiError, OSError) as err:
                last = str(err)
            time.sleep(0.3)
        raise TimeoutError(
            f"the control plane is not ready after {timeout}s: {last}; the API server's"
            f" log ends: {self.log_tail('kube-apiserver', 1500)}"
        )

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def compact(self) -> None:
        """Compact etcd to its current revision: older resourceVersions are gone (a
        watch resuming from one gets 410 Gone and must list again)."""
        etcdctl = str(Path(self.binaries.etcd).with_name("etcdctl"))
        env = dict(os.environ, ETCDCTL_API="3")
        status = subprocess.run(
            ["ip", "netns", "exec", self.netns, etcdctl, "--endpoints", ETCD,
             "endpoint", "status", "--write-out", "json"],
            capture_output=True, text=True, check=True, env=env,
        )  # fmt: skip
        revision = json.loads(status.stdout)[0]["Status"]["header"]["revision"]
        subprocess.run(
            ["ip", "netns", "exec", self.netns, etcdctl, "--endpoints", ETCD,
             "compact", str(revision)],
            capture_output=True, text=True, check=True, env=env,
        )  # fmt: skip

    def down(self) -> None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            self.stop(name)
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None


# Where a lone control plane's API server says it is (on its loopback device; TEST-NET-1,
# never routed, and not a loopback address, which the API server would not advertise).
LONE_ADDRESS = "192.0.2.2"


@contextlib.contextmanager
def lone_control_plane(
    netns: str,
    workdir: Path,
    binaries: Binaries,
    service_cidrs: Sequence[str],
    *,
    extra_args: Mapping[str, Sequence[str]] | None = None,
) -> Iterator[ControlPlane]:
    """etcd, kube-apiserver and kube-controller-manager alone in namespace ``netns``
    (created here, deleted by name afterwards), serving ``service_cidrs``."""
    first_ips = [
        str(ipaddress.ip_network(c, strict=False).network_address + 1) for c in service_cidrs
    ]
    add_netns(netns)
    cp: ControlPlane | None = None
    try:
        sh("ip", "-n", netns, "addr", "add", f"{LONE_ADDRESS}/32", "dev", "lo")
        workdir.mkdir(parents=True, exist_ok=True)
        cp = ControlPlane(
            netns,
            LONE_ADDRESS,
            workdir,
            binaries,
            tuple(service_cidrs),
            tuple(first_ips),
            extra_args=dict(extra_args or {}),
        )
        cp.up()
        yield cp
    finally:
        if cp is not None:
            cp.down()
        delete_netns(netns)
