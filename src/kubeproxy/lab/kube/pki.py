"""The lab cluster's certificates and keys, made with openssl (P-256: fast to make).

One CA signs the API server's serving certificate and the client certificates (an admin
in ``system:masters``, the controller manager as ``system:kube-controller-manager``,
which the API server's bootstrap RBAC binds); a separate key pair signs and verifies
service-account tokens (kubeproxy on the nodes uses such a token, for deploy/'s
ServiceAccount).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DAYS = "30"


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=cwd, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}: {proc.stderr.strip()}")


def _key(path: Path) -> None:
    _openssl(
        "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(path), cwd=path.parent
    )


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca: Pair
    apiserver: Pair
    admin: Pair
    controller_manager: Pair
    sa_key: Path
    sa_pub: Path

    @classmethod
    def create(cls, directory: Path, api_addresses: Sequence[str]) -> Pki:
        """Everything under ``directory``; the serving certificate is valid for
        ``api_addresses`` (and 127.0.0.1, the Service's first ClusterIP is the caller's
        to include)."""
        directory.mkdir(parents=True, exist_ok=True)
        ca = Pair(directory / "ca.crt", directory / "ca.key")
        _key(ca.key)
        _openssl(
            "req", "-x509", "-new", "-key", str(ca.key), "-out", str(ca.cert), "-days", DAYS,
            "-subj", "/CN=kubeproxy-lab-ca", cwd=directory,
        )  # fmt: skip
        sans = ",".join(
            [f"IP:{a}" for a in ("127.0.0.1", *api_addresses)]
            + ["DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default.svc"]
        )
        apiserver = _issue(directory, ca, "apiserver", "/CN=kube-apiserver", server=sans)
        admin = _issue(directory, ca, "admin", "/O=system:masters/CN=kubeproxy-lab-admin")
        kcm = _issue(directory, ca, "kcm", "/CN=system:kube-controller-manager")
        sa_key, sa_pub = directory / "sa.key", directory / "sa.pub"
        _key(sa_key)
        _openssl("ec", "-in", str(sa_key), "-pubout", "-out", str(sa_pub), cwd=directory)
        return cls(directory, ca, apiserver, admin, kcm, sa_key, sa_pub)


def _issue(directory: Path, ca: Pair, name: str, subject: str, server: str = "") -> Pair:
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    _key(pair.key)
    csr = directory / f"{name}.csr"
    _openssl(
        "req", "-new", "-key", str(pair.key), "-out", str(csr), "-subj", subject, cwd=directory
    )
    ext = directory / f"{name}.ext"
    usage = "serverAuth" if server else "clientAuth"
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if server:
        lines.append(f"subjectAltName={server}")
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-out", str(pair.cert), "-days", DAYS, "-extfile", str(ext),
        cwd=directory,
    )  # fmt: skip
    return pair
