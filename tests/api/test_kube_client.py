"""kubeproxy.sources.kube_client: configuration as upstream's createClient, auth, rate limit.

Configuration and credentials are exercised end to end: a kubeconfig (bearer token file,
exec plugin), ``--master``, and the in-cluster service account against the stand-in
over HTTPS with a CA generated for the test (skipped without the ``openssl`` command).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeproxy.config.runtime import ConfigError
from kubeproxy.sources.kube import KubeSource
from kubeproxy.sources.kube_client import Connection, TokenBucket, load_connection
from kubeproxy.sources.kube_informer import Backoff
from tests.api.conftest import FAST, NODE, Consumer, run, summary
from tests.apiserver import ApiServer
from tests.conftest import require_tool
from tests.unit.conftest import service_obj


def kubeconfig(path: Path, server: str, user: dict[str, Any], **cluster: Any) -> str:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    return str(path)


def source(connection: Connection) -> KubeSource:
    return KubeSource(connection, NODE, tuning=FAST)


async def first_services(connection: Connection) -> list[tuple[str, str, str]]:
    async with Consumer(source(connection)) as consumer:
        return summary(await consumer.next_batch())


# ========================================================================= configuration


def test_master_alone_is_the_server_url_without_credentials() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            api.create(service_obj("web"))
            connection = load_connection(None, api.url)
            assert connection.server == api.url and connection.ssl_context is None
            assert await connection.credentials.header() is None
            assert await first_services(connection) == [("ADDED", "Service", "default/web")]

    run(scenario)


def test_a_kubeconfig_token_file_is_read_again_after_a_401(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")

    async def scenario() -> None:
        async with ApiServer(token="first") as api:
            api.create(service_obj("web"))
            path = kubeconfig(tmp_path / "config", api.url, {"tokenFile": str(token)})
            async with Consumer(source(load_connection(path, None, qps=-1))) as consumer:
                await consumer.next_batch()
                await consumer.until(lambda: api.watch_count == 4)
                # The token rotates (as kubelet rotates projected service-account tokens).
                token.write_text("second\n")
                api.token = "second"
                api.drop_watches()
                api.create(service_obj("db", clusterIP="10.96.0.11"))
                assert summary(await consumer.next_batch()) == [("ADDED", "Service", "default/db")]
            assert any(r.params.get("watch") for r in api.requests[-4:])

    run(scenario)


def test_missing_credentials_are_retried_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = tmp_path / "token"  # not there yet (the kubelet has not projected it)

    async def scenario() -> None:
        async with ApiServer(token="late") as api:
            api.create(service_obj("web"))
            path = kubeconfig(tmp_path / "config", api.url, {"tokenFile": str(token)})
            async with Consumer(source(load_connection(path, None, qps=-1))) as consumer:
                assert await consumer.quiet(0.2) == []
                token.write_text("late")
                assert summary(await consumer.next_batch()) == [("ADDED", "Service", "default/web")]

    with caplog.at_level(logging.WARNING, logger="kubeproxy.sources"):
        run(scenario)
    assert "Cannot discover the networking.k8s.io/v1 API: cannot get credentials" in caplog.text


def test_master_overrides_the_kubeconfig_server_and_keeps_its_credentials(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with ApiServer(token="secret") as api:
            api.create(service_obj("web"))
            path = kubeconfig(tmp_path / "config", "https://elsewhere:6443", {"token": "secret"})
            connection = load_connection(path, api.url)
            assert connection.server == api.url
            assert await first_services(connection) == [("ADDED", "Service", "default/web")]

    run(scenario)


def test_an_exec_credential_plugin_provides_the_token(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1',\n"
        "                  'kind': 'ExecCredential', 'status': {'token': 'from-exec'}}))\n"
    )

    async def scenario() -> None:
        async with ApiServer(token="from-exec") as api:
            api.create(service_obj("web"))
            user = {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1beta1",
                    "command": sys.executable,
                    "args": [str(plugin)],
                }
            }
            connection = load_connection(kubeconfig(tmp_path / "config", api.url, user), None)
            assert await first_services(connection) == [("ADDED", "Service", "default/web")]

    run(scenario)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA and a server certificate for 127.0.0.1."""
    require_tool("openssl", "a CA and a server certificate for the HTTPS test")
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=apiserver")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-extfile", "san.ext")  # fmt: skip
    return d


def test_in_cluster_service_account_over_https(
    pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    shutil.copy(pki / "ca.crt", account / "ca.crt")
    (account / "token").write_text("sa-token")
    (account / "namespace").write_text("kube-system")
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(pki / "server.crt", pki / "server.key")

    async def scenario() -> None:
        async with ApiServer(token="sa-token", ssl_context=server_tls) as api:
            api.create(service_obj("web"))
            monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
            connection = load_connection(None, None, service_account=str(account))
            assert connection.server == api.url
            assert await first_services(connection) == [("ADDED", "Service", "default/web")]

    with caplog.at_level(logging.INFO, logger="kubeproxy.sources"):
        run(scenario)
    assert "falling back to in-cluster config" in caplog.text


def test_an_untrusted_server_certificate_is_a_failure_not_a_crash(
    pki: Path, tmp_path: Path
) -> None:
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(pki / "server.crt", pki / "server.key")

    async def scenario() -> None:
        async with ApiServer(ssl_context=server_tls) as api:
            # No certificate-authority: the system trust store does not know our CA.
            path = kubeconfig(tmp_path / "config", api.url, {"token": "t"})
            async with Consumer(source(load_connection(path, None, qps=-1))) as consumer:
                assert await consumer.quiet(0.2) == []
            assert api.requests == []  # the TLS handshake failed: no request got through

    run(scenario)


def test_neither_kubeconfig_nor_master_outside_a_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="--kubeconfig"):
        load_connection(None, None, service_account=str(tmp_path / "missing"))


@pytest.mark.parametrize(
    "kubeconfig_text,message",
    [
        (None, "not found"),
        ("clusters: []\ncontexts: []\n", "current context"),
        ("current-context: x\nclusters: []\ncontexts: []\n", "not found"),
    ],
)
def test_bad_kubeconfigs_are_config_errors(
    tmp_path: Path, kubeconfig_text: str | None, message: str
) -> None:
    path = tmp_path / "config"
    if kubeconfig_text is not None:
        path.write_text(kubeconfig_text)
    with pytest.raises(ConfigError, match=message):
        load_connection(str(path), None)


@pytest.mark.parametrize(
    "cluster,user,named",
    [
        ({"certificate-authority": "ca.crt"}, {}, "certificate-authority {dir}/ca.crt"),
        (
            {"insecure-skip-tls-verify": True},
            {"client-certificate": "/nonexistent/c.crt", "client-key": "c.key"},
            "client-certificate /nonexistent/c.crt",
        ),
    ],
)
def test_a_missing_credential_file_is_named(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], named: str
) -> None:
    """The ssl module says only "No such file or directory": the error names the
    kubeconfig field and the file (relative to the kubeconfig's directory, as kubectl)."""
    path = kubeconfig(tmp_path / "config", "https://127.0.0.1:6443", user, **cluster)
    with pytest.raises(ConfigError) as err:
        load_connection(path, None)
    assert str(err.value) == (
        "cannot use the API server credentials: "
        + named.format(dir=tmp_path)
        + ": No such file or directory"
    )


def test_content_types(caplog: pytest.LogCaptureFixture) -> None:
    load_connection(None, "http://127.0.0.1:1", content_type="application/json")
    with caplog.at_level(logging.INFO, logger="kubeproxy.sources"):
        # Upstream's default: accepted, served as JSON, said once.
        load_connection(
            None, "http://127.0.0.1:1", content_type="application/vnd.kubernetes.protobuf"
        )
    assert "not supported; using application/json" in caplog.text
    with pytest.raises(ConfigError, match="contentType"):
        load_connection(None, "http://127.0.0.1:1", content_type="application/yaml")
    with pytest.raises(ConfigError, match="must start with"):
        load_connection(None, "127.0.0.1:6443")


def test_from_flags_applies_client_go_defaults_for_zero_qps_and_burst() -> None:
    built = KubeSource.from_flags(
        kubeconfig=None,
        master="http://127.0.0.1:1",
        node_name=NODE,
        proxy_name="",
        qps=0,
        burst=0,
        content_type="application/json",
    )
    assert (built.connection.limiter.qps, built.connection.limiter.burst) == (5.0, 10)
    assert built.proxy_name is None and built.node_name == NODE
    tuned = KubeSource.from_flags(
        kubeconfig=None, master="http://127.0.0.1:1", node_name=NODE, qps=50, burst=100
    )
    assert (tuned.connection.limiter.qps, tuned.connection.limiter.burst) == (50.0, 100)


# ========================================================================= rate limiting


def test_token_bucket_allows_a_burst_then_spaces_requests() -> None:
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    bucket = TokenBucket(qps=2.0, burst=3, clock=lambda: now[0], sleep=sleep)

    async def scenario() -> None:
        for _ in range(5):
            await bucket.acquire()
        assert slept == [0.5, 1.0]  # tokens 4 and 5 are due 0.5 s and 1 s from now
        now[0] = 10.0  # refilled up to the burst, not beyond
        slept.clear()
        for _ in range(4):
            await bucket.acquire()
        assert slept == [0.5]

    asyncio.run(scenario())


def test_negative_qps_disables_the_limiter() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    bucket = TokenBucket(qps=-1, burst=1, clock=lambda: 0.0, sleep=sleep)

    async def scenario() -> None:
        for _ in range(100):
            await bucket.acquire()

    asyncio.run(scenario())
    assert slept == []  # a bucket of 1 with a stopped clock, yet no request waited


def test_requests_to_the_api_server_are_rate_limited() -> None:
    """Every request takes a token: with the clock stopped and a burst of 1, the k-th
    request after the first is due k/qps seconds later (the sleeps are recorded, not
    slept)."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def scenario() -> None:
        async with ApiServer() as api:
            connection = load_connection(None, api.url, qps=20, burst=1)
            assert (connection.limiter.qps, connection.limiter.burst) == (20.0, 1)
            connection.limiter = replace(connection.limiter, clock=lambda: 0.0, sleep=sleep)
            async with Consumer(source(connection)) as consumer:
                await consumer.next_batch()
        # Discovery and four lists at least (watches may follow), one token each.
        assert len(slept) >= 4
        assert slept == pytest.approx([k / 20 for k in range(1, len(slept) + 1)])

    run(scenario)


def test_backoff_doubles_up_to_its_cap_with_jitter_and_resets() -> None:
    values = iter([0.0, 1.0, 0.5, 0.0, 0.999, 0.0, 0.0])
    backoff = Backoff(0.5, 2.0, rng=lambda: next(values))
    delays = [backoff.next_delay() for _ in range(5)]
    assert delays == [0.25, 1.0, 1.5, 1.0, pytest.approx(1.999)]
    backoff.reset()
    assert backoff.next_delay() == 0.25
