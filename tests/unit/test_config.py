"""kubeproxy.config: the v1alpha1 KubeProxyConfiguration file, flags and validation.

The expectations are upstream kube-proxy's: its defaulted empty config
(``pkg/proxy/apis/config/scheme/testdata/.../after/v1alpha1.yaml``), its validation field
paths (``validation/field_paths_test.go``) and messages, Go's duration syntax, and
``cmd/kube-proxy/app/options.go``'s flag precedence.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeproxy.config.codec import ConfigFileError, decode, load_config, loads, to_dict, to_yaml
from kubeproxy.config.defaults import complete, default_config, mode_settings
from kubeproxy.config.duration import Duration
from kubeproxy.config.features import feature_flags, feature_gate_warnings
from kubeproxy.config.flags import FLAGS, FlagError, add_arguments, apply_flags, given_flags
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.options import split_config
from kubeproxy.config.types import KubeProxyConfiguration
from kubeproxy.config.validation import validate

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kubeproxy-config.yaml"
HEADER = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"


def doc(body: str = "") -> str:
    return HEADER + body


def seconds(n: float) -> Duration:
    return Duration.of_seconds(n)


# ------------------------------------------------------------------------ durations


@pytest.mark.parametrize(
    ("text", "nanoseconds", "printed"),
    [
        ("0", 0, "0s"),
        ("0s", 0, "0s"),
        ("1s", 10**9, "1s"),
        ("500ms", 5 * 10**8, "500ms"),
        ("1m30s", 90 * 10**9, "1m30s"),
        ("90s", 90 * 10**9, "1m30s"),
        ("24h0m0s", 24 * 3600 * 10**9, "24h0m0s"),
        ("1h", 3600 * 10**9, "1h0m0s"),
        ("1.5h", 5400 * 10**9, "1h30m0s"),
        ("2h22m", (2 * 3600 + 22 * 60) * 10**9, "2h22m0s"),
        ("-1s", -(10**9), "-1s"),
        ("+5s", 5 * 10**9, "5s"),
        ("1.5s", 15 * 10**8, "1.5s"),
        ("1ms500us", 1_500_000, "1.5ms"),
        ("1500ns", 1500, "1.5\u00b5s"),
        ("3\u00b5s", 3000, "3\u00b5s"),
        ("7ns", 7, "7ns"),
        (".5s", 5 * 10**8, "500ms"),
    ],
)
def test_durations_parse_and_print_as_go(text: str, nanoseconds: int, printed: str) -> None:
    d = Duration.parse(text)
    assert d.nanoseconds == nanoseconds
    assert str(d) == printed
    assert Duration.parse(str(d)) == d


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'time: invalid duration ""'),
        ("1", 'time: missing unit in duration "1"'),
        ("30", 'time: missing unit in duration "30"'),
        ("1x", 'time: unknown unit "x" in duration "1x"'),
        ("s", 'time: invalid duration "s"'),
        ("-", 'time: invalid duration "-"'),
        ("1.s5", 'time: missing unit in duration "1.s5"'),
        ("1h2", 'time: missing unit in duration "1h2"'),
        ("9999999999h", 'time: invalid duration "9999999999h"'),
    ],
)
def test_bad_durations_are_refused_with_go_messages(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        Duration.parse(text)


# ------------------------------------------------------------------------- defaults


def test_defaults_are_upstreams_for_an_empty_file() -> None:
    cfg = loads(doc())
    assert cfg == default_config()
    # Upstream's defaulted empty v1alpha1 object, field for field.
    expected = yaml.safe_load(
        """
        apiVersion: kubeproxy.config.k8s.io/v1alpha1
        bindAddress: 0.0.0.0
        bindAddressHardFail: false
        clientConnection: {acceptContentTypes: "", burst: 10,
          contentType: application/vnd.kubernetes.protobuf, kubeconfig: "", qps: 5}
        clusterCIDR: ""
        configSyncPeriod: 15m0s
        conntrack: {maxPerCore: 32768, min: 131072, tcpBeLiberal: false,
          tcpCloseWaitTimeout: 1h0m0s, tcpEstablishedTimeout: 24h0m0s,
          udpStreamTimeout: 0s, udpTimeout: 0s}
        detectLocal: {bridgeInterface: "", interfaceNamePrefix: ""}
        detectLocalMode: ""
        enableProfiling: false
        healthzBindAddress: 0.0.0.0:10256
        hostnameOverride: ""
        iptables: {localhostNodePorts: true, masqueradeAll: false, masqueradeBit: 14,
          minSyncPeriod: 1s, snatNodeInternalIP: null, syncPeriod: 30s}
        ipvs: {excludeCIDRs: null, minSyncPeriod: 0s, scheduler: "", strictARP: false,
          syncPeriod: 30s, tcpFinTimeout: 0s, tcpTimeout: 0s, udpTimeout: 0s}
        kind: KubeProxyConfiguration
        logging: {flushFrequency: 5s, format: text,
          options: {json: {infoBufferSize: "0"}, text: {infoBufferSize: "0"}}, verbosity: 0}
        metricsBindAddress: 127.0.0.1:10249
        mode: ""
        nftables: {masqueradeAll: false, masqueradeBit: 14, minSyncPeriod: 1s, syncPeriod: 30s}
        nodePortAddresses: null
        oomScoreAdj: -999
        portRange: ""
        showHiddenMetricsForVersion: ""
        winkernel: {enableDSR: false, forwardHealthCheckVip: false, networkName: "",
          rootHnsEndpointName: "", sourceVip: ""}
        """
    )
    assert to_dict(cfg) == expected
    assert validate(cfg) == []


def test_defaults_fill_zero_values_and_ports_as_upstream() -> None:
    cfg = loads(
        doc(
            "bindAddress: '::'\n"
            "healthzBindAddress: 0.0.0.0\n"
            "iptables: {syncPeriod: 0s, minSyncPeriod: 0s}\n"
            "conntrack: {tcpEstablishedTimeout: 0s}\n"
        )
    )
    assert cfg.healthz_bind_address == "0.0.0.0:10256"  # a bare IP gets the port
    assert cfg.metrics_bind_address == "[::1]:10249"  # IPv6 bindAddress: IPv6 default
    # A zero duration means unset, as upstream: defaulted, not "sync on every change".
    assert cfg.iptables.sync_period == seconds(30)
    assert cfg.iptables.min_sync_period == seconds(1)
    # A pointer field given as 0 stays 0 (leave the kernel's value alone).
    assert cfg.conntrack.tcp_established_timeout == Duration(0)


def test_complete_applies_upstreams_platform_defaults() -> None:
    nft = complete(loads(doc("mode: nftables\n")))
    assert nft.node_port_addresses == ("primary",)
    assert nft.detect_local_mode == "ClusterCIDR"
    ipt = complete(loads(doc("mode: iptables\n")))
    assert ipt.node_port_addresses is None  # all local IPs in iptables mode
    explicit = complete(loads(doc("mode: nftables\nnodePortAddresses: [10.0.0.0/8]\n")))
    assert explicit.node_port_addresses == ("10.0.0.0/8",)


def test_blank_mode_is_iptables_as_upstream_with_the_iptables_section_values() -> None:
    # kubeadm's ConfigMap says mode: "": upstream runs iptables mode, NodePorts on every
    # local address (127.0.0.1 too), and so must a drop-in.
    cfg = loads(doc("iptables: {syncPeriod: 10s, minSyncPeriod: 2s, masqueradeAll: true}\n"))
    before = mode_settings(cfg)
    done = complete(cfg)
    assert done.mode == "iptables"
    assert done.node_port_addresses is None
    assert mode_settings(done) == dataclasses.replace(before, mode=ProxyMode.IPTABLES)
    assert before.sync_period == seconds(10)
    assert before.masquerade_all is True


def test_mode_settings_read_the_active_modes_section() -> None:
    cfg = loads(
        doc(
            "mode: nftables\n"
            "iptables: {syncPeriod: 10s, masqueradeBit: 3}\n"
            "nftables: {syncPeriod: 20s, minSyncPeriod: 3s, masqueradeAll: true,"
            " masqueradeBit: 5}\n"
        )
    )
    settings = mode_settings(cfg)
    assert (settings.mode, settings.sync_period, settings.min_sync_period) == (
        "nftables",
        seconds(20),
        seconds(3),
    )
    assert (settings.masquerade_all, settings.masquerade_bit) == (True, 5)


# ------------------------------------------------------------------------ decoding


def test_round_trip_through_yaml_and_json(tmp_path: Path) -> None:
    cfg = complete(
        loads(
            doc(
                "mode: nftables\nclusterCIDR: 10.244.0.0/16,fd00:10:244::/56\n"
                "featureGates: {PreferSameTrafficDistribution: false}\n"
                "conntrack: {udpTimeout: 1m30s, tcpBeLiberal: true}\n"
                "ipvs: {excludeCIDRs: [10.0.0.0/8]}\n"
                "logging: {vmodule: [{filePattern: proxier, verbosity: 4}], flushFrequency: 1500}\n"
                "clientConnection: {qps: 7.5}\n"
            )
        )
    )
    written = tmp_path / "out.yaml"
    written.write_text(to_yaml(cfg))
    assert load_config(written) == cfg
    as_json = tmp_path / "out.json"
    as_json.write_text(json.dumps(to_dict(cfg)))
    assert load_config(as_json) == cfg
    assert cfg.logging.flush_frequency == Duration(1500)  # integer nanoseconds accepted


def test_unknown_fields_are_errors_naming_their_path() -> None:
    with pytest.raises(ConfigFileError) as caught:
        loads(doc("bogus: 1\nnftables: {syncPeriod: 1s, fastSync: true}\nlogging: {x: 1}\n"))
    assert caught.value.errors == [
        'unknown field "bogus"',
        'unknown field "nftables.fastSync"',
        'unknown field "logging.x"',
    ]


def test_lenient_decoding_warns_about_unknown_fields_as_upstreams_fallback() -> None:
    warnings: list[str] = []
    cfg = loads(doc("bogus: 1\nmode: nftables\n"), strict=False, warn=warnings.append)
    assert cfg.mode == "nftables"
    assert warnings == ['Using lenient decoding as strict decoding failed: unknown field "bogus"']
    with pytest.raises(
        ConfigFileError, match="mode: cannot unmarshal number into string"
    ):  # type errors fail either way
        loads(doc("mode: 1\n"), strict=False)


def test_wrong_types_are_errors_and_all_are_reported_at_once() -> None:
    with pytest.raises(ConfigFileError) as caught:
        loads(
            doc(
                "hostnameOverride: 12\n"
                "bindAddressHardFail: 'yes please'\n"
                "oomScoreAdj: 1.5\n"
                "conntrack: {maxPerCore: 99999999999, udpTimeout: 30}\n"
                "nftables: {syncPeriod: 1y}\n"
                "featureGates: {Foo: maybe}\n"
                "nodePortAddresses: primary\n"
                "ipvs: []\n"
            )
        )
    assert caught.value.errors == [
        "hostnameOverride: cannot unmarshal number into string",
        "bindAddressHardFail: cannot unmarshal string into bool",
        "oomScoreAdj: cannot unmarshal number into int32",
        "conntrack.maxPerCore: cannot unmarshal number 99999999999 into int32",
        "conntrack.udpTimeout: cannot unmarshal number into duration string",
        'nftables.syncPeriod: time: unknown unit "y" in duration "1y"',
        "featureGates.Foo: cannot unmarshal string into bool",
        "nodePortAddresses: cannot unmarshal string into array",
        "ipvs: cannot unmarshal array into object KubeProxyIPVSConfiguration",
    ]


def test_decode_keeps_what_it_could_decode_alongside_the_errors() -> None:
    cfg, errors = decode(doc("bogus: 1\nmode: nftables\nnftables: {minSyncPeriod: -1s}\n"))
    assert errors == ['unknown field "bogus"']
    assert cfg.mode == "nftables"
    assert cfg.nftables.min_sync_period == Duration.of_seconds(-1)
    assert cfg.nftables.sync_period == seconds(30)  # defaults applied


def test_a_file_with_unknown_fields_and_invalid_values_warns_and_reports(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from kubeproxy.cli import build_parser, load_configuration
    from kubeproxy.config.runtime import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        doc(
            "mode: nftables\n"
            "nftables:\n  minSyncPeriod: -1s\n  bogus: 1\n"
            "oomScoreAdj: 5000\n"
            "bindAddressHardFail: maybe\n"
        )
    )
    args = build_parser().parse_args(["run", "--config", str(bad)])
    with pytest.raises(ConfigError) as caught:
        load_configuration(args)
    lines = str(caught.value).splitlines()
    assert lines[0] == f"invalid configuration in {bad}:"
    # Unknown fields: upstream's lenient fallback, a warning; everything else an error.
    assert [r.message for r in caplog.records if "lenient" in r.message] == [
        'Using lenient decoding as strict decoding failed: unknown field "nftables.bogus"'
    ]
    assert [line.strip() for line in lines[1:]] == [
        "bindAddressHardFail: cannot unmarshal string into bool",
        "oomScoreAdj: Invalid value: 5000: must be within the range [-1000, 1000]",
        "nftables.minSyncPeriod: Invalid value: -1s: must be greater than or equal to 0",
    ]


def test_api_version_and_kind_must_match() -> None:
    with pytest.raises(ConfigFileError, match="'Kind' and 'apiVersion' must be set"):
        loads("mode: nftables\n")
    with pytest.raises(ConfigFileError, match='no kind "KubeProxyConfiguration" is registered'):
        loads("apiVersion: kubeproxy.config.k8s.io/v1beta9\nkind: KubeProxyConfiguration\n")
    with pytest.raises(ConfigFileError, match='no kind "KubeletConfiguration"'):
        loads("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n")


def test_duplicate_fields_and_bad_documents_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match='duplicate field "mode"'):
        loads(doc("mode: nftables\nmode: iptables\n"))
    with pytest.raises(ConfigFileError, match='duplicate field "mode"'):
        loads('{"apiVersion": "x", "mode": "a", "mode": "b"}')
    with pytest.raises(ConfigFileError, match="expected a KubeProxyConfiguration object"):
        loads("- a\n- b\n")
    with pytest.raises(ConfigFileError, match="found several"):
        loads(doc() + "---\n" + doc())
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigFileError, match=r"missing\.yaml"):
        load_config(missing)


def test_the_example_file_loads_and_validates() -> None:
    # Its second document holds kubeproxy's own options (kubeproxy.config.options).
    upstream_doc, options = split_config(EXAMPLE.read_text(), str(EXAMPLE))
    assert options.manifests == EXAMPLE.parent
    cfg = complete(loads(upstream_doc, source=str(EXAMPLE)))
    assert validate(cfg) == []
    assert feature_gate_warnings(cfg) == []
    assert cfg.mode == "nftables"
    assert cfg.hostname_override == "node-a"
    assert cfg.cluster_cidrs == ("10.244.0.0/16", "fd00:10:244::/56")
    assert cfg.node_port_addresses == ("primary",)
    # Healthz and metrics keep their default addresses (no clash with anything else).
    assert cfg.healthz_bind_address == "0.0.0.0:10256"
    assert cfg.metrics_bind_address == "127.0.0.1:10249"


# ---------------------------------------------------------------------- validation

NEGATIVE = Duration(-(10**9))


def errors_for(cfg: KubeProxyConfiguration) -> list[str]:
    return [e.split(":", 1)[0] for e in validate(cfg)]


def test_every_error_is_reported_at_once_with_upstream_field_paths() -> None:
    # The cases of upstream's TestValidateV1Alpha1FieldPaths, all in one config.
    base = default_config()
    cfg = dataclasses.replace(
        base,
        bind_address="10.10.12.11:2000",
        healthz_bind_address="0.0.0.0",
        metrics_bind_address="127.0.0.1",
        iptables=dataclasses.replace(base.iptables, masquerade_bit=32),
        oom_score_adj=1001,
        conntrack=dataclasses.replace(
            base.conntrack,
            max_per_core=-1,
            min=-1,
            tcp_established_timeout=NEGATIVE,
            tcp_close_wait_timeout=NEGATIVE,
            udp_timeout=NEGATIVE,
            udp_stream_timeout=NEGATIVE,
        ),
        client_connection=dataclasses.replace(base.client_connection, burst=-1),
        config_sync_period=NEGATIVE,
        mode="invalid",
        detect_local_mode="invalid",
        node_port_addresses=("192.168.0.0/16", "invalid"),
        show_hidden_metrics_for_version="invalid",
        logging=dataclasses.replace(base.logging, format="invalid"),
    )
    assert sorted(errors_for(cfg)) == sorted(
        [
            "bindAddress",
            "healthzBindAddress",
            "metricsBindAddress",
            "iptables.masqueradeBit",
            "oomScoreAdj",
            "conntrack.maxPerCore",
            "conntrack.min",
            "conntrack.tcpEstablishedTimeout",
            "conntrack.tcpCloseWaitTimeout",
            "conntrack.udpTimeout",
            "conntrack.udpStreamTimeout",
            "clientConnection.burst",
            "configSyncPeriod",
            "mode",
            "detectLocalMode",
            "nodePortAddresses[1]",
            "showHiddenMetricsForVersion",
            "logging.format",
        ]
    )


def test_messages_use_upstreams_wording() -> None:
    base = default_config()
    cfg = dataclasses.replace(
        base,
        mode=ProxyMode.NFTABLES,
        nftables=dataclasses.replace(base.nftables, masquerade_bit=32, min_sync_period=NEGATIVE),
        oom_score_adj=1001,
        conntrack=dataclasses.replace(base.conntrack, udp_timeout=NEGATIVE),
        detect_local_mode="Nope",
        node_port_addresses=("primary", "10.0.0.0/8", "all", "primary", "10.0.0.1"),
        port_range="2000-300",
    )
    assert validate(cfg) == [
        "nftables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]",
        "conntrack.udpTimeout: Invalid value: -1s: must be greater than or equal to 0",
        "oomScoreAdj: Invalid value: 1001: must be within the range [-1000, 1000]",
        "nftables.minSyncPeriod: Invalid value: -1s: must be greater than or equal to 0",
        'portRange: Invalid value: "2000-300": must be a valid port range (e.g. 300-2000)',
        'nodePortAddresses[3]: Duplicate value: "primary"',
        'nodePortAddresses[4]: Invalid value: "10.0.0.1": must be a valid CIDR or one of the '
        "keywords 'primary', 'localhost', 'all'",
        'detectLocalMode: Unsupported value: "Nope": supported values: "ClusterCIDR", '
        '"NodeCIDR", "BridgeInterface", "InterfaceNamePrefix", ""',
    ]


@pytest.mark.parametrize(
    ("mode", "prefix"),
    [("", "iptables"), ("iptables", "iptables"), ("ipvs", "ipvs"), ("nftables", "nftables")],
)
@pytest.mark.parametrize(
    ("sync", "min_sync", "expected"),
    [
        (Duration(0), Duration(0), "syncPeriod: Invalid value: 0s: must be greater than 0"),
        (
            seconds(1),
            NEGATIVE,
            "minSyncPeriod: Invalid value: -1s: must be greater than or equal to 0",
        ),
        (
            seconds(1),
            seconds(2),
            "syncPeriod: Invalid value: 2s: must be greater than or equal to {p}.minSyncPeriod",
        ),
    ],
)
def test_sync_periods_are_checked_in_the_active_modes_section(
    mode: str, prefix: str, sync: Duration, min_sync: Duration, expected: str
) -> None:
    base = dataclasses.replace(default_config(), mode=mode)
    section = getattr(base, prefix)
    cfg = dataclasses.replace(
        base,
        **{prefix: dataclasses.replace(section, sync_period=sync, min_sync_period=min_sync)},
    )
    assert validate(cfg) == [f"{prefix}." + expected.format(p=prefix)]


def test_mode_specific_sections_are_validated_only_in_their_mode() -> None:
    base = default_config()
    broken = dataclasses.replace(
        base,
        ipvs=dataclasses.replace(
            base.ipvs,
            tcp_timeout=NEGATIVE,
            tcp_fin_timeout=NEGATIVE,
            udp_timeout=NEGATIVE,
            exclude_cidrs=("192.168.0.0/16", "invalid"),
        ),
        nftables=dataclasses.replace(base.nftables, masquerade_bit=32),
    )
    assert validate(dataclasses.replace(broken, mode=ProxyMode.IPTABLES)) == []
    assert errors_for(dataclasses.replace(broken, mode=ProxyMode.IPVS)) == [
        "ipvs.tcpTimeout",
        "ipvs.tcpFinTimeout",
        "ipvs.udpTimeout",
        "ipvs.excludeCIDRs[1]",
    ]
    assert errors_for(dataclasses.replace(broken, mode=ProxyMode.NFTABLES)) == [
        "nftables.masqueradeBit"
    ]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"detect_local_mode": "BridgeInterface"}, ["detectLocal.bridgeInterface"]),
        ({"detect_local_mode": "InterfaceNamePrefix"}, ["detectLocal.interfaceNamePrefix"]),
        (
            {"detect_local_mode": "ClusterCIDR", "cluster_cidr": "192.168.0.0/16,invalid"},
            ["clusterCIDR"],
        ),
        (
            {"detect_local_mode": "ClusterCIDR", "cluster_cidr": "192.168.0.0/16,10.0.0.0/8"},
            ["clusterCIDR"],
        ),
        ({"cluster_cidr": "10.0.0.0/8,fd00::/64"}, []),
        ({"detect_local_mode": "NodeCIDR", "cluster_cidr": "junk"}, []),
    ],
)
def test_detect_local_validation(changes: dict[str, Any], expected: list[str]) -> None:
    assert errors_for(dataclasses.replace(default_config(), **changes)) == expected


def test_logging_validation() -> None:
    cfg = loads(
        doc(
            "logging:\n"
            "  format: json\n"
            "  vmodule: [{filePattern: 'a=b', verbosity: 1}, {filePattern: '', verbosity: 2}]\n"
            "  options: {text: {splitStream: true, infoBufferSize: 1Mi}}\n"
        )
    )
    assert validate(cfg) == [
        "logging.vmodule: Forbidden: Only supported for text log format",
        'logging.vmodule[0]: Invalid value: "a=b": File pattern must not contain equal sign '
        "or comma",
        "logging.vmodule[1]: Required value: File pattern must not be empty",
        "logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled",
        "logging.options.text.infoBufferSize: Forbidden: Feature LoggingAlphaOptions is disabled",
    ]
    allowed = dataclasses.replace(cfg, feature_gates={"LoggingAlphaOptions": True})
    assert [e for e in validate(allowed) if "options" in e] == []


def test_unknown_feature_gates_warn_and_known_ones_reach_the_core() -> None:
    cfg = loads(doc("featureGates: {PreferSameTrafficDistribution: false, SomeOtherGate: true}\n"))
    assert validate(cfg) == []
    assert feature_gate_warnings(cfg) == [
        "featureGates.SomeOtherGate: unrecognized feature gate, ignored"
    ]
    assert feature_flags(cfg).prefer_same_traffic_distribution is False
    assert feature_flags(default_config()).prefer_same_traffic_distribution is True


# --------------------------------------------------------------------------- flags


def test_flags_apply_on_defaults_without_a_config_file() -> None:
    cfg = apply_flags(
        default_config(),
        {
            "proxy-mode": "nftables",
            "hostname-override": "  Node-A ",
            "cluster-cidr": "10.244.0.0/16,fd00:10:244::/56",
            "nodeport-addresses": ["10.0.0.0/8,192.168.0.0/16", "172.16.0.0/12"],
            "masquerade-all": True,
            "bind-address": "192.168.50.1",
            "healthz-bind-address": "0.0.0.0:12345",
            "metrics-bind-address": "[::1]:9999",
            "iptables-sync-period": "10s",
            "iptables-min-sync-period": Duration(0),
            "iptables-masquerade-bit": "3",
            "conntrack-max-per-core": "0",
            "conntrack-min": 5,
            "conntrack-tcp-timeout-established": "1h",
            "conntrack-tcp-timeout-close-wait": "30m",
            "conntrack-tcp-be-liberal": "true",
            "conntrack-udp-timeout": "30s",
            "conntrack-udp-timeout-stream": "2m",
            "feature-gates": ["A=true,B=false", "A=false"],
            "kubeconfig": "/etc/kubeconfig",
            "master": "https://10.0.0.1:6443",
            "v": "4",
        },
    )
    assert cfg.mode == "nftables"
    assert cfg.hostname_override == "node-a"  # trimmed and lower-cased, as upstream
    assert cfg.cluster_cidr == "10.244.0.0/16,fd00:10:244::/56"
    assert cfg.node_port_addresses == ("10.0.0.0/8", "192.168.0.0/16", "172.16.0.0/12")
    # Mode-dependent flags land in the active mode's section.
    assert cfg.nftables.masquerade_all is True
    assert cfg.nftables.sync_period == seconds(10)
    assert cfg.nftables.min_sync_period == Duration(0)
    assert cfg.iptables.sync_period == seconds(30)
    assert cfg.iptables.masquerade_bit == 3  # --iptables-masquerade-bit is iptables-only
    assert cfg.bind_address == "192.168.50.1"
    assert cfg.healthz_bind_address == "0.0.0.0:12345"
    assert cfg.metrics_bind_address == "[::1]:9999"
    ct = cfg.conntrack
    assert (ct.max_per_core, ct.min, ct.tcp_be_liberal) == (0, 5, True)
    assert ct.tcp_established_timeout == seconds(3600)
    assert ct.tcp_close_wait_timeout == seconds(1800)
    assert (ct.udp_timeout, ct.udp_stream_timeout) == (seconds(30), seconds(120))
    assert cfg.feature_gates == {"A": False, "B": False}
    assert cfg.client_connection.kubeconfig == "/etc/kubeconfig"
    assert cfg.logging.verbosity == 4
    assert validate(complete(cfg)) == []


def test_with_a_config_file_only_hostname_and_logging_flags_win() -> None:
    from_file = loads(doc("mode: nftables\nhostnameOverride: from-file\nclusterCIDR: 10.0.0.0/8\n"))
    ignored: list[str] = []
    cfg = apply_flags(
        from_file,
        {
            "hostname-override": "from-flag",
            "cluster-cidr": "10.244.0.0/16",
            "masquerade-all": True,
            "v": 3,
            "master": "https://api",
        },
        config_file=True,
        warn=ignored.append,
    )
    assert cfg.hostname_override == "from-flag"
    assert cfg.logging.verbosity == 3
    assert cfg.cluster_cidr == "10.0.0.0/8"
    assert cfg.nftables.masquerade_all is False
    assert ignored == [
        "--cluster-cidr is ignored because a config file is given (--config)",
        "--masquerade-all is ignored because a config file is given (--config)",
    ]


def test_mode_limited_flags_follow_the_mode() -> None:
    seen: list[str] = []
    ipvs = apply_flags(
        default_config(),
        {"iptables-sync-period": "5s", "ipvs-sync-period": "7s", "proxy-mode": "ipvs"},
        warn=seen.append,
    )
    assert ipvs.ipvs.sync_period == seconds(7)
    assert ipvs.iptables.sync_period == seconds(30)
    assert seen == ["--iptables-sync-period is ignored in proxy mode 'ipvs'"]
    blank = apply_flags(default_config(), {"iptables-sync-period": "5s", "masquerade-all": True})
    assert blank.iptables.sync_period == seconds(5)
    assert mode_settings(complete(blank)).sync_period == seconds(5)
    assert mode_settings(complete(blank)).masquerade_all is True


def test_bad_flag_values_name_the_flag() -> None:
    with pytest.raises(FlagError, match="--iptables-sync-period: time: missing unit"):
        apply_flags(default_config(), {"iptables-sync-period": "30"})
    with pytest.raises(FlagError, match="--hostname-override: empty hostname-override"):
        apply_flags(default_config(), {"hostname-override": "   "})
    with pytest.raises(FlagError, match="--bind-address"):
        apply_flags(default_config(), {"bind-address": "not-an-ip"})
    with pytest.raises(FlagError, match="--no-such-flag"):
        apply_flags(default_config(), {"no-such-flag": "1"})


def test_argparse_options_are_generated_from_the_table() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, skip=("v",))
    args = parser.parse_args(
        [
            "--proxy-mode",
            "nftables",
            "--masquerade-all",
            "--conntrack-udp-timeout",
            "45s",
            "--nodeport-addresses",
            "10.0.0.0/8",
            "--nodeport-addresses",
            "192.168.0.0/16",
            "--feature-gates",
            "X=true",
        ]
    )
    given = given_flags(args, skip=("v",))
    assert given == {
        "proxy-mode": "nftables",
        "nodeport-addresses": [("10.0.0.0/8",), ("192.168.0.0/16",)],
        "masquerade-all": True,
        "conntrack-udp-timeout": seconds(45),
        "feature-gates": [{"X": True}],
    }
    cfg = apply_flags(default_config(), given)
    assert cfg.node_port_addresses == ("10.0.0.0/8", "192.168.0.0/16")
    assert cfg.nftables.masquerade_all is True
    assert cfg.conntrack.udp_timeout == seconds(45)
    with pytest.raises(SystemExit, match=r"^2$"):  # argparse's usage error
        parser.parse_args(["--conntrack-min", "lots"])
    assert all(spec.help for spec in FLAGS)
