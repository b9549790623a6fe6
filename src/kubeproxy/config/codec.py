"""Reading and writing the ``--config`` file (upstream's strict codec and encoder).

* :func:`load_config` / :func:`loads` — YAML or JSON, strict like upstream's strict codec:
  unknown and duplicate fields, wrong types and a wrong apiVersion/kind are errors naming
  the field path; every problem is reported at once (:class:`ConfigFileError`). Then
  upstream's scheme defaults (:func:`~kubeproxy.config.defaults.set_defaults`) are
  applied, as upstream's decoder does. :func:`decode` is the same but returns the errors
  with the configuration built from everything else, so ``kubeproxy.cli`` validates that
  too and reports decode and validation errors together (upstream stops at the first kind).
* :func:`to_dict` / :func:`to_yaml` — ``--write-config-to`` and ``/configz``: the
  effective configuration, keys sorted and every field written, as upstream's encoder does.

The types are :mod:`.types`; kubeproxy's own second document of the file is
:mod:`.options`. Pure: no I/O except reading the file in :func:`load_config`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kubeproxy.config.defaults import set_defaults
from kubeproxy.config.duration import Duration
from kubeproxy.config.types import API_VERSION, INT32, KIND, UINT32, KubeProxyConfiguration


class ConfigFileError(ValueError):
    """The file cannot be decoded; ``errors`` lists every problem, each naming its field."""

    def __init__(self, source: str, errors: Sequence[str]) -> None:
        self.source = source
        self.errors = list(errors)
        super().__init__(f"{source}: " + "; ".join(self.errors))


# -------------------------------------------------------------------------- decoding


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional_inner(tp: Any) -> Any | None:
    """``X`` for ``X | None``; None for any other annotation."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


class _Decoder:
    """Turns parsed YAML/JSON into the dataclass tree, collecting every error."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def wrong_type(self, path: str, value: Any, want: str) -> None:
        self.errors.append(f"{path}: cannot unmarshal {_json_kind(value)} into {want}")

    def dataclass(self, cls: type[Any], data: Any, path: str) -> Any:
        if not isinstance(data, dict):
            self.wrong_type(path or "<root>", data, f"object {cls.__name__}")
            return cls()
        hints = _hints(cls)
        by_json = {f.metadata["json"]: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            f = by_json.get(key) if isinstance(key, str) else None
            if f is None:
                message = f'unknown field "{where}"'
                (self.errors if self.strict else self.warnings).append(message)
                continue
            values[f.name] = self.value(hints[f.name], f.metadata["kind"], value, where)
        return cls(**values)

    def value(self, tp: Any, kind: str, value: Any, path: str) -> Any:
        inner = _optional_inner(tp)
        if inner is not None:
            return None if value is None else self.value(inner, kind, value, path)
        if value is None:
            return _zero(tp)
        if tp is str:
            return self.string(kind, value, path)
        if tp is bool:
            if isinstance(value, bool):
                return value
            self.wrong_type(path, value, "bool")
            return False
        if tp is int:
            return self.integer(kind or "int", value, path)
        if tp is float:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            self.wrong_type(path, value, "float32")
            return 0.0
        if tp is Duration:
            return self.duration(kind, value, path)
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.dataclass(tp, value, path)
        origin = typing.get_origin(tp)
        if origin is tuple:
            return self.sequence(typing.get_args(tp)[0], value, path)
        if origin is Mapping:
            return self.bool_map(value, path)
        raise TypeError(f"unsupported annotation {tp!r} at {path}")  # a bug in this module

    def string(self, kind: str, value: Any, path: str) -> str:
        if isinstance(value, str):
            return value
        # resource.Quantity accepts a bare number too.
        if kind == "quantity" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        self.wrong_type(path, value, "string")
        return ""

    def integer(self, kind: str, value: Any, path: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            self.wrong_type(path, value, kind)
            return 0
        low, high = UINT32 if kind == "uint32" else INT32
        if not low <= value <= high:
            self.errors.append(f"{path}: cannot unmarshal number {value} into {kind}")
            return 0
        return value

    def duration(self, kind: str, value: Any, path: str) -> Duration:
        if kind == "time_or_duration" and isinstance(value, int) and not isinstance(value, bool):
            return Duration(value)
        if not isinstance(value, str):
            self.wrong_type(path, value, "duration string")
            return Duration()
        try:
            return Duration.parse(value)
        except ValueError as err:
            self.errors.append(f"{path}: {err}")
            return Duration()

    def sequence(self, item: Any, value: Any, path: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            self.wrong_type(path, value, "array")
            return ()
        return tuple(self.value(item, "", v, f"{path}[{i}]") for i, v in enumerate(value))

    def bool_map(self, value: Any, path: str) -> dict[str, bool]:
        if not isinstance(value, dict):
            self.wrong_type(path, value, "map[string]bool")
            return {}
        out: dict[str, bool] = {}
        for key, flag in value.items():
            if not isinstance(flag, bool):
                self.wrong_type(f"{path}.{key}", flag, "bool")
                continue
            out[str(key)] = flag
        return out


def _zero(tp: Any) -> Any:
    if tp is Duration:
        return Duration()
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp()
    origin = typing.get_origin(tp)
    if origin is tuple:
        return ()
    if origin is Mapping:
        return {}
    return tp()


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys, as upstream's strict decoder does."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f'duplicate field "{key}"', key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f'duplicate field "{key}"')
        out[key] = value
    return out


def _parse_document(text: str) -> Any:
    if text.lstrip().startswith("{"):
        return json.loads(text, object_pairs_hook=_no_duplicates)
    docs = [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    if len(docs) > 1:
        raise ValueError("expected one KubeProxyConfiguration document, found several")
    return docs[0] if docs else None


def decode(
    text: str,
    *,
    source: str = "<config>",
    strict: bool = True,
    warn: Callable[[str], None] | None = None,
) -> tuple[KubeProxyConfiguration, list[str]]:
    """Decode as much of a KubeProxyConfiguration document as possible.

    Returns the configuration built from every field that could be decoded (a field in
    error keeps its zero value), with upstream's defaults applied, and the decode errors
    (wrong apiVersion/kind, unknown fields, wrong types), so a caller can validate the
    rest and report everything at once. Raises ConfigFileError only when there is no
    object to decode (not YAML/JSON, duplicate keys, several documents, not a mapping).

    ``strict=False`` is upstream's fallback for v1alpha1: unknown fields are passed to
    ``warn`` instead of being errors (type errors still are).
    """
    try:
        data = _parse_document(text)
    except (yaml.YAMLError, ValueError) as err:
        raise ConfigFileError(source, [f"failed to decode: {err}"]) from None
    if not isinstance(data, dict):
        raise ConfigFileError(source, ["expected a KubeProxyConfiguration object"])
    errors = []
    api_version, kind = data.pop("apiVersion", None), data.pop("kind", None)
    if kind is None or api_version is None:
        errors.append("Object 'Kind' and 'apiVersion' must be set")
    elif kind != KIND or api_version != API_VERSION:
        errors.append(
            f'no kind "{kind}" is registered for version "{api_version}" '
            f"(expected apiVersion {API_VERSION}, kind {KIND})"
        )
    decoder = _Decoder(strict)
    cfg = decoder.dataclass(KubeProxyConfiguration, data, "")
    errors.extend(decoder.errors)
    if decoder.warnings and warn is not None:
        warn("Using lenient decoding as strict decoding failed: " + "; ".join(decoder.warnings))
    return set_defaults(cfg), errors


def loads(
    text: str,
    *,
    source: str = "<config>",
    strict: bool = True,
    warn: Callable[[str], None] | None = None,
) -> KubeProxyConfiguration:
    """Decode a KubeProxyConfiguration document and apply upstream's defaults; raises
    ConfigFileError listing every decode error (see :func:`decode`)."""
    cfg, errors = decode(text, source=source, strict=strict, warn=warn)
    if errors:
        raise ConfigFileError(source, errors)
    return cfg


def load_config(
    path: Path, *, strict: bool = True, warn: Callable[[str], None] | None = None
) -> KubeProxyConfiguration:
    """Read ``path`` (YAML or JSON); raises ConfigFileError listing every problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigFileError(str(path), [err.strerror or str(err)]) from None
    return loads(text, source=str(path), strict=strict, warn=warn)


# -------------------------------------------------------------------------- encoding


def to_dict(cfg: KubeProxyConfiguration) -> dict[str, Any]:
    """The v1alpha1 JSON object, every field present except upstream's ``omitempty`` ones."""
    body = _encode(cfg)
    assert isinstance(body, dict)
    return dict(sorted({"apiVersion": API_VERSION, "kind": KIND, **body}.items()))


def _encode(value: Any) -> Any:
    if isinstance(value, Duration):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata["omitempty"] and not item:
                continue
            out[f.metadata["json"]] = _encode(item)
        return dict(sorted(out.items()))
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {k: value[k] for k in sorted(value)}
    if isinstance(value, float) and value.is_integer():
        return int(value)  # Go prints float32 5 as 5
    return value


class _Dumper(yaml.SafeDumper):
    """Quotes strings with double quotes, as Go's YAML encoder does, when quoting is needed."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    plain_tag = dumper.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    style = '"' if text == "" or plain_tag != "tag:yaml.org,2002:str" else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _represent_str)


def to_yaml(cfg: KubeProxyConfiguration) -> str:
    """``--write-config-to``: YAML that :func:`load_config` reads back to ``cfg``."""
    return yaml.dump(to_dict(cfg), Dumper=_Dumper, sort_keys=True, default_flow_style=False)
