"""The web configuration file (``--web.config.file``): TLS, client certificates, basic auth.

The format is exporter-toolkit's (prometheus/exporter-toolkit ``docs/web-configuration.md``), so
a file written for node_exporter, dcgm-exporter or nvidia_gpu_exporter works here::

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to this file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      client_allowed_sans: [prometheus.monitoring.svc]
      min_version: TLS12
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt (htpasswd -nBC 10 "" | tr -d ':\\n')
    rate_limit: {interval: 100ms, burst: 20}

Parsing is strict, like exporter-toolkit's ``yaml.UnmarshalStrict``: unknown or duplicate keys,
wrong types, unknown TLS versions, ciphers or curves, malformed bcrypt hashes and unreadable
certificate, key or CA files are a :class:`WebConfigError` naming the key. Where Python's ``ssl``
module cannot do what a value asks, the value is refused rather than approximated:

- ``client_auth_type`` ``RequestClientCert`` and ``RequireAnyClientCert`` (accept a certificate
  without verifying it; exporter-toolkit calls them insecure): OpenSSL verifies every certificate a
  client sends. ``VerifyClientCertIfGiven`` and ``RequireAndVerifyClientCert`` need a client CA.
- ``curve_preferences`` with more than one curve: ``ssl`` sets one curve.
- ``http_server_config.http2``: accepted (``true`` is the toolkit's default), HTTP/1.1 is served.

:class:`WebConfigWatcher` re-reads the file, and the certificate, key and CA files it names, when
any of them changes (a Kubernetes Secret update, cert-manager rotation), at most once a second;
a new TLS context is then used for new connections. A change that does not load (a half-written
key, a typo) keeps the previous configuration and is logged once, and
``nvgpu_web_config_last_reload_successful`` turns 0.

The request-time checks live here too, stdlib and ``bcrypt`` only (the HTTP side calls them):
:class:`BasicAuth` (bcrypt, results cached, one bcrypt at a time in a thread, an unknown user
costs the same as a wrong password) and :func:`peer_problem` (``client_allowed_sans``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import difflib
import hashlib
import ipaddress
import logging
import os
import re
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class WebConfigError(ValueError):
    """The web configuration file (or a file it names) is not usable; the message says why."""


TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
TLS_KEYS = (
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
HTTP_KEYS = ("http2", "headers")
RATE_KEYS = ("interval", "burst")

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

# Go's crypto/tls.CipherSuites() names (the secure list exporter-toolkit accepts) -> OpenSSL names.
# TLS 1.3 suites are not configurable in Go or here; they are accepted and have no effect.
CIPHERS = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_AES_128_GCM_SHA256": "",
    "TLS_AES_256_GCM_SHA384": "",
    "TLS_CHACHA20_POLY1305_SHA256": "",
}
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}

# exporter-toolkit's http_server_config.headers: the headers it lets you set, and the values it takes.
HEADERS: dict[str, tuple[str, ...]] = {
    "Content-Security-Policy": (),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": (),
    "Strict-Transport-Security": (),
}

BCRYPT_HASH = re.compile(r"\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}")
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class TlsSettings:
    """``tls_server_config``, with paths made absolute and names mapped to OpenSSL's.

    Attributes:
        cert_file: server certificate chain (PEM), or "" when ``cert`` is inline.
        key_file: its private key (PEM), or "" when ``key`` is inline.
        cert_pem: inline certificate chain (``cert``), or "".
        key_pem: inline key (``key``), or "".
        client_auth: one of :data:`CLIENT_AUTH_TYPES`.
        client_ca_file: CA bundle for client certificates, or "".
        client_ca_pem: inline CA bundle (``client_ca``), or "".
        client_allowed_sans: a client certificate must carry one of these SANs (empty: any).
        min_version: lowest TLS version accepted.
        max_version: highest TLS version accepted.
        ciphers: OpenSSL cipher list for TLS <= 1.2 ("" = OpenSSL's default).
        prefer_server_ciphers: the server's order wins.
        curve: the one ECDH curve to use ("" = OpenSSL's default groups).
    """

    cert_file: str = ""
    key_file: str = ""
    cert_pem: str = ""
    key_pem: str = ""
    client_auth: str = "NoClientCert"
    client_ca_file: str = ""
    client_ca_pem: str = ""
    client_allowed_sans: tuple[str, ...] = ()
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    ciphers: str = ""
    prefer_server_ciphers: bool = True
    curve: str = ""

    @property
    def verifies_clients(self) -> bool:
        """Client certificates are requested and verified against the client CA."""
        return self.client_auth != "NoClientCert"

    @property
    def requires_client_cert(self) -> bool:
        """``RequireAndVerifyClientCert``: no verified certificate, no answer."""
        return self.client_auth == "RequireAndVerifyClientCert"

    def files(self) -> tuple[str, ...]:
        """The files this configuration reads (for change detection)."""
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)


@dataclass(frozen=True)
class WebConfig:
    """One loaded web configuration file.

    Attributes:
        path: the file, absolute.
        tls: ``tls_server_config``; None serves plain HTTP.
        users: user name -> bcrypt hash; empty means no basic auth.
        headers: response headers from ``http_server_config.headers``.
        http2: ``http_server_config.http2`` (accepted; HTTP/1.1 is served).
        rate_interval_s: ``rate_limit.interval`` in seconds; 0 disables the limiter.
        rate_burst: ``rate_limit.burst``.
        context: the TLS server context built from ``tls`` (None without TLS). Client
            certificates are requested and verified if given (``CERT_OPTIONAL``) when
            ``client_auth_type`` verifies them; :class:`WebConfigWatcher` asks for ``CERT_REQUIRED``
            when probes must present one too.
    """

    path: str
    tls: TlsSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    http2: bool = True
    rate_interval_s: float = 0.0
    rate_burst: int = 0
    context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)

    def files(self) -> tuple[str, ...]:
        """Every file this configuration was read from."""
        return (self.path, *(self.tls.files() if self.tls else ()))

    def describe(self) -> str:
        """One line for the start-up log."""
        parts = []
        if self.tls is None:
            parts.append("plain HTTP")
        else:
            parts.append(f"TLS {self.tls.min_version.name}-{self.tls.max_version.name}")
            if self.tls.verifies_clients:
                parts.append(f"client certificates {self.tls.client_auth}")
        parts.append(f"basic auth for {len(self.users)} user(s)" if self.users else "no basic auth")
        if self.rate_interval_s:
            parts.append(f"rate limit {self.rate_burst} per {self.rate_interval_s:g} s")
        return ", ".join(parts)


# -- loading -------------------------------------------------------------------------------------


def load(path: str, *, require_client_cert: bool = False) -> WebConfig:
    """Read, validate and build a web configuration.

    Args:
        path: the YAML file.
        require_client_cert: build the TLS context with ``CERT_REQUIRED`` for
            ``RequireAndVerifyClientCert`` (the handshake itself refuses clients without a
            certificate: what exporter-toolkit does). False (the default) requests and verifies
            a certificate if one is given and leaves the refusal to the HTTP layer, so the probe
            paths can be exempt (``NVGPU_WEB_PROBES_WITHOUT_AUTH``).

    Returns:
        The configuration, with its TLS context built (certificate and key loaded).

    Raises:
        WebConfigError: the file or a file it names is missing, unreadable or invalid.
    """
    path = os.path.abspath(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(1 << 20)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise WebConfigError(f"cannot read {path!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if len(raw) >= 1 << 20:
        raise WebConfigError(f"{path}: larger than 1 MiB; is it the right file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WebConfigError(f"{path}: not UTF-8 ({exc})") from None
    data = _parse_yaml(path, text)
    base = os.path.dirname(path)
    _check_keys(path, data, TOP_KEYS, "")
    tls = _tls(path, base, _mapping(path, data, "tls_server_config"))
    http2, headers = _http(path, _mapping(path, data, "http_server_config"))
    users = _users(path, data.get("basic_auth_users"))
    rate_interval_s, rate_burst = _rate(path, _mapping(path, data, "rate_limit"))
    try:
        context = build_context(tls, require_client_cert) if tls is not None else None
    except WebConfigError as exc:
        raise WebConfigError(f"{path}: {exc}") from None
    return WebConfig(path, tls, users, headers, http2, rate_interval_s, rate_burst, context)


def _parse_yaml(path: str, text: str) -> dict[str, Any]:
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses duplicate keys (yaml.v2 UnmarshalStrict does too)."""

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in seen:
                raise WebConfigError(f"{path}: line {key_node.start_mark.line + 1}: duplicate key {key!r}")
            seen.add(key)
        return dict(loader.construct_mapping(node, deep=True))

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WebConfigError(f"{path}: expected a mapping with keys {', '.join(TOP_KEYS)}, got {type(data).__name__}")
    return data


def _check_keys(path: str, data: Mapping[Any, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]}?" if close else f" (known: {', '.join(allowed)})"
            raise WebConfigError(f"{path}: unknown key {where}{key!r}{hint}")


def _mapping(path: str, data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{path}: {key} must be a mapping, got {type(value).__name__}")
    return value


def _string(path: str, where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise WebConfigError(f"{path}: {where} must be a string, got {value!r}")
    return value


def _strings(path: str, where: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WebConfigError(f"{path}: {where} must be a list of strings, got {value!r}")
    return list(value)


def _bool(path: str, where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise WebConfigError(f"{path}: {where} must be true or false, got {value!r}")
    return value


def _tls(path: str, base: str, data: dict[str, Any]) -> TlsSettings | None:
    if not data:
        return None
    _check_keys(path, data, TLS_KEYS, "tls_server_config.")
    where = "tls_server_config."
    values = {k: _string(path, where + k, data[k]) for k in TLS_KEYS if k in data and k in _STRING_TLS_KEYS}
    for inline, file_key in (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file")):
        if values.get(inline) and values.get(file_key):
            raise WebConfigError(f"{path}: give {where}{inline} or {where}{file_key}, not both")
    if not (values.get("cert") or values.get("cert_file")):
        raise WebConfigError(f"{path}: {where}cert_file (or cert) is missing")
    if not (values.get("key") or values.get("key_file")):
        raise WebConfigError(f"{path}: {where}key_file (or key) is missing")
    client_auth = values.get("client_auth_type") or "NoClientCert"
    if client_auth in UNSUPPORTED_CLIENT_AUTH:
        raise WebConfigError(
            f"{path}: {where}client_auth_type {client_auth} is not supported: it accepts a client certificate "
            "without verifying it (exporter-toolkit calls it insecure), and OpenSSL verifies every certificate "
            "it is sent; use RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file"
        )
    if client_auth not in CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"{path}: {where}client_auth_type {client_auth!r} is not one of {', '.join(CLIENT_AUTH_TYPES)}"
        )
    has_ca = bool(values.get("client_ca") or values.get("client_ca_file"))
    if has_ca and client_auth == "NoClientCert":
        raise WebConfigError(
            f"{path}: {where}client_ca_file is set but client_auth_type is NoClientCert; "
            "set client_auth_type: RequireAndVerifyClientCert"
        )
    if client_auth != "NoClientCert" and not has_ca:
        raise WebConfigError(f"{path}: {where}client_auth_type {client_auth} needs client_ca_file (or client_ca)")
    sans = _strings(path, where + "client_allowed_sans", data.get("client_allowed_sans"))
    if sans and client_auth != "RequireAndVerifyClientCert":
        raise WebConfigError(f"{path}: {where}client_allowed_sans needs client_auth_type RequireAndVerifyClientCert")
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = values.get(key, default)
        if name not in TLS_VERSIONS:
            raise WebConfigError(f"{path}: {where}{key} {name!r} is not one of {', '.join(TLS_VERSIONS)}")
        versions[key] = TLS_VERSIONS[name]
    if versions["min_version"] > versions["max_version"]:
        raise WebConfigError(f"{path}: {where}min_version is above max_version")
    ciphers = []
    for name in _strings(path, where + "cipher_suites", data.get("cipher_suites")):
        if name not in CIPHERS:
            close = difflib.get_close_matches(name, list(CIPHERS), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise WebConfigError(f"{path}: {where}cipher_suites: unknown or insecure cipher {name!r}{hint}")
        if CIPHERS[name] and CIPHERS[name] not in ciphers:
            ciphers.append(CIPHERS[name])
    curves = _strings(path, where + "curve_preferences", data.get("curve_preferences"))
    for name in curves:
        if name not in CURVES:
            raise WebConfigError(f"{path}: {where}curve_preferences: unknown curve {name!r} ({', '.join(CURVES)})")
    if len(curves) > 1:
        raise WebConfigError(
            f"{path}: {where}curve_preferences: Python's ssl module sets one curve; give one of {', '.join(curves)}"
        )
    prefer = data.get("prefer_server_cipher_suites", True)
    return TlsSettings(
        cert_file=_resolve(base, values.get("cert_file", "")),
        key_file=_resolve(base, values.get("key_file", "")),
        cert_pem=values.get("cert", ""),
        key_pem=values.get("key", ""),
        client_auth=client_auth,
        client_ca_file=_resolve(base, values.get("client_ca_file", "")),
        client_ca_pem=values.get("client_ca", ""),
        client_allowed_sans=tuple(sans),
        min_version=versions["min_version"],
        max_version=versions["max_version"],
        ciphers=":".join(ciphers),
        prefer_server_ciphers=_bool(path, where + "prefer_server_cipher_suites", prefer),
        curve=CURVES[curves[0]] if curves else "",
    )


_STRING_TLS_KEYS = (
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
)


def _resolve(base: str, path: str) -> str:
    return os.path.normpath(os.path.join(base, path)) if path else ""


def _http(path: str, data: dict[str, Any]) -> tuple[bool, dict[str, str]]:
    _check_keys(path, data, HTTP_KEYS, "http_server_config.")
    http2 = _bool(path, "http_server_config.http2", data.get("http2", True))
    raw = data.get("headers") or {}
    if not isinstance(raw, dict):
        raise WebConfigError(f"{path}: http_server_config.headers must be a mapping")
    headers = {}
    for name, value in raw.items():
        if name not in HEADERS:
            raise WebConfigError(
                f"{path}: http_server_config.headers: {name!r} cannot be set (settable: {', '.join(HEADERS)})"
            )
        text = _string(path, f"http_server_config.headers.{name}", value)
        allowed = HEADERS[name]
        if text and allowed and text.lower() not in allowed:
            raise WebConfigError(
                f"{path}: http_server_config.headers.{name}: {text!r} is not one of {', '.join(allowed)}"
            )
        if any(c in text for c in "\r\n\0"):
            raise WebConfigError(f"{path}: http_server_config.headers.{name}: line breaks are not allowed")
        if text:
            headers[name] = text
    return http2, headers


def _users(path: str, data: Any) -> dict[str, bytes]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WebConfigError(f"{path}: basic_auth_users must be a mapping of user name to bcrypt hash")
    users = {}
    for user, hashed in data.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"{path}: basic_auth_users: user name {user!r} must be a non-empty string without ':'")
        text = _string(path, f"basic_auth_users.{user}", hashed)
        m = BCRYPT_HASH.fullmatch(text)
        if m is None:
            raise WebConfigError(
                f"{path}: basic_auth_users.{user} is not a bcrypt hash ($2y$10$ followed by 53 characters); "
                "make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'"
            )
        if not 4 <= int(m.group(1)) <= 31:
            raise WebConfigError(f"{path}: basic_auth_users.{user}: bcrypt cost {m.group(1)} is not in 4..31")
        users[user] = text.encode()
    return users


def _rate(path: str, data: dict[str, Any]) -> tuple[float, int]:
    if not data:
        return 0.0, 0
    _check_keys(path, data, RATE_KEYS, "rate_limit.")
    interval = data.get("interval", "0")
    seconds = parse_go_duration(path, "rate_limit.interval", interval)
    burst = data.get("burst", 0)
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 0:
        raise WebConfigError(f"{path}: rate_limit.burst must be a non-negative integer, got {burst!r}")
    if seconds and burst == 0:
        raise WebConfigError(f"{path}: rate_limit.burst is 0: every request would be refused")
    return seconds, burst


def parse_go_duration(path: str, where: str, value: Any) -> float:
    """A Go duration (``100ms``, ``1m30s``, ``0``) in seconds."""
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        return 0.0
    text = value if isinstance(value, str) else None
    if text == "0":
        return 0.0
    if not text or _GO_DURATION.sub("", text) != "":
        raise WebConfigError(f"{path}: {where} must be a duration such as 100ms, 1s or 1m30s, got {value!r}")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in _GO_DURATION.findall(text))


def build_context(tls: TlsSettings, require_client_cert: bool = False) -> ssl.SSLContext:
    """The server-side TLS context of ``tls``, certificate and key loaded.

    Raises:
        WebConfigError: a file is missing or unreadable, the key does not match the certificate,
            or OpenSSL refuses a cipher or curve.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = tls.min_version
    ctx.maximum_version = tls.max_version
    ctx.set_alpn_protocols(["http/1.1"])
    if tls.prefer_server_ciphers:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        if tls.ciphers:
            ctx.set_ciphers(tls.ciphers)
        if tls.curve:
            ctx.set_ecdh_curve(tls.curve)
    except (ssl.SSLError, ValueError) as exc:
        raise WebConfigError(f"tls_server_config: OpenSSL refused the cipher or curve settings: {exc}") from None
    _load_chain(ctx, tls)
    if tls.verifies_clients:
        try:
            if tls.client_ca_file:
                ctx.load_verify_locations(cafile=tls.client_ca_file)
            else:
                ctx.load_verify_locations(cadata=tls.client_ca_pem)
        except (OSError, ssl.SSLError, ValueError) as exc:
            where = tls.client_ca_file or "tls_server_config.client_ca"
            raise WebConfigError(f"tls_server_config.client_ca_file {where}: {_reason(exc)}") from None
        required = tls.requires_client_cert and require_client_cert
        ctx.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    return ctx


def _load_chain(ctx: ssl.SSLContext, tls: TlsSettings) -> None:
    for key, file in (("cert_file", tls.cert_file), ("key_file", tls.key_file)):
        if file and not os.access(file, os.R_OK):
            why = "does not exist" if not os.path.exists(file) else "is not readable by this user"
            raise WebConfigError(f"tls_server_config.{key} {file} {why}")
    if tls.cert_file and tls.key_file:
        try:
            ctx.load_cert_chain(tls.cert_file, tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(
                f"tls_server_config: cannot load cert_file {tls.cert_file} with key_file {tls.key_file}: {_reason(exc)}"
            ) from None
        return
    # Inline PEM (cert/key): ssl loads chains only from files, so write them to a private
    # temporary directory, load, and remove them at once.
    with tempfile.TemporaryDirectory(prefix="nvgpu-tls-") as tmp:
        os.chmod(tmp, 0o700)
        cert = tls.cert_file or _write_private(tmp, "cert.pem", tls.cert_pem)
        key = tls.key_file or _write_private(tmp, "key.pem", tls.key_pem)
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"tls_server_config: cannot load the certificate and key: {_reason(exc)}") from None


def _write_private(directory: str, name: str, text: str) -> str:
    target = os.path.join(directory, name)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return target


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return f"{exc.reason} ({exc.library or 'ssl'})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# -- reloading -----------------------------------------------------------------------------------


Signature = tuple[tuple[str, tuple[int, int, int, int] | None], ...]


def _signature(files: tuple[str, ...]) -> Signature:
    out: list[tuple[str, tuple[int, int, int, int] | None]] = []
    for f in files:
        try:
            st = os.stat(f)  # follows links: a Secret update swaps the ..data link
            out.append((f, (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)))
        except OSError:
            out.append((f, None))
    return tuple(out)


class WebConfigWatcher:
    """The current web configuration, re-read when its files change.

    Args:
        path: the web configuration file.
        require_client_cert: see :func:`load`.
        check_every_s: look at the files at most this often.
        clock: monotonic clock (tests).

    Raises:
        WebConfigError: the first load failed (the exporter does not start).
    """

    def __init__(
        self,
        path: str,
        require_client_cert: bool = False,
        check_every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.require_client_cert = require_client_cert
        self.check_every_s = check_every_s
        self.clock = clock
        self.current = load(path, require_client_cert=require_client_cert)
        self._signature = _signature(self.current.files())
        self._checked = clock()
        self.last_reload_ok = True
        self.last_reload_time = time.time()
        self.reloads = 0
        self._failed_signature: Signature | None = None

    def refresh(self) -> WebConfig:
        """The configuration to use now; reloads it first when a file changed."""
        now = self.clock()
        if now - self._checked < self.check_every_s:
            return self.current
        self._checked = now
        signature = _signature(self.current.files())
        if signature == self._signature:
            return self.current
        if signature == self._failed_signature:
            return self.current  # still the same broken files: logged once already
        try:
            new = load(self.path, require_client_cert=self.require_client_cert)
        except WebConfigError as exc:
            self._failed_signature = signature
            self.last_reload_ok = False
            log.error(
                "web config %s changed but does not load (%s); keeping the previous one (%s)",
                self.path,
                exc,
                self.current.describe(),
                extra={"web_config": self.path},
            )
            return self.current
        self.current = new
        self._signature = _signature(new.files())
        self._failed_signature = None
        self.last_reload_ok = True
        self.last_reload_time = time.time()
        self.reloads += 1
        log.info("web config %s reloaded: %s", self.path, new.describe(), extra={"web_config": self.path})
        return new


# -- request-time checks -------------------------------------------------------------------------


def peer_problem(tls: TlsSettings, peercert: Mapping[str, Any] | None) -> str | None:
    """Why a verified client certificate is not acceptable under ``client_allowed_sans``, or None.

    Args:
        tls: the TLS settings in force.
        peercert: ``SSLObject.getpeercert()`` (None when the client sent no certificate).
    """
    if not tls.client_allowed_sans or peercert is None:
        return None
    sans = [str(v) for _k, v in peercert.get("subjectAltName", ())]
    for want in tls.client_allowed_sans:
        for have in sans:
            if _same_san(want, have):
                return None
    return f"client certificate SANs {sans} match none of client_allowed_sans"


def _same_san(want: str, have: str) -> bool:
    if want == have.strip():
        return True
    try:
        return ipaddress.ip_address(want) == ipaddress.ip_address(have.strip())
    except ValueError:
        return False


# A bcrypt hash (cost 10, the usual) of a random password nobody knows: an unknown user name is
# checked against it (or against one made at the users' cost when that is not 10), so it costs as
# much as a wrong password for a known user (no user-name oracle by timing; exporter-toolkit does
# the same with a fixed cost-10 hash).
DUMMY_HASH = b"$2b$10$zUHUiAyiYk8/znYRYN/Vk.UY8oY9WNdQF7uWeqOQYC2jOADYtdyBS"


def _bcrypt_check(password: bytes, hashed: bytes) -> bool:
    import bcrypt

    try:
        return bool(bcrypt.checkpw(password, hashed))
    except ValueError:  # bcrypt >= 5 refuses passwords over 72 bytes; so does Go's bcrypt
        return False


class BasicAuth:
    """HTTP basic auth against bcrypt hashes (RFC 7617).

    bcrypt is slow on purpose (~50-100 ms at cost 10), so each (user, hash, password) result is
    cached (a bounded LRU keyed by a SHA-256 of the three, never the password itself), and the
    bcrypt calls run one at a time in a thread: the event loop keeps serving, and a flood of
    wrong passwords costs one core at most.

    Args:
        checkpw: ``(password, hash) -> bool`` (tests count calls).
        cache_size: results kept.
    """

    def __init__(self, checkpw: Callable[[bytes, bytes], bool] = _bcrypt_check, cache_size: int = 1024) -> None:
        self.checkpw = checkpw
        self.cache_size = cache_size
        self._cache: collections.OrderedDict[bytes, bool] = collections.OrderedDict()
        self._lock: asyncio.Lock | None = None
        self._dummies: dict[int, bytes] = {}

    @staticmethod
    def parse(header: str | None) -> tuple[str, bytes] | None:
        """``Authorization: Basic …`` -> (user, password); None when absent or malformed."""
        if not header:
            return None
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "basic" or not token.strip():
            return None
        try:
            decoded = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = decoded.partition(b":")
        if not sep:
            return None
        return user.decode("utf-8", "replace"), password

    async def check(self, users: Mapping[str, bytes], header: str | None) -> str | None:
        """The authenticated user name, or None (missing, malformed or wrong credentials)."""
        creds = self.parse(header)
        if creds is None:
            return None
        user, password = creds
        hashed = users.get(user)
        known = hashed is not None
        key = hashlib.sha256(b"\0".join((user.encode(), hashed or b"?", password))).digest()
        ok = self._cache.get(key)
        if ok is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                against = hashed if hashed is not None else await self._dummy(users)
                ok = await asyncio.to_thread(self.checkpw, password, against)
            self._cache[key] = ok
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return user if ok and known else None

    async def _dummy(self, users: Mapping[str, bytes]) -> bytes:
        """A hash of nobody's password at the cost of the configured users' hashes (the highest)."""
        costs = [int(m.group(1)) for h in users.values() if (m := BCRYPT_HASH.fullmatch(h.decode()))]
        cost = max(costs, default=10)
        if cost == 10:
            return DUMMY_HASH
        if cost not in self._dummies:
            self._dummies[cost] = await asyncio.to_thread(_hash_random, cost)
        return self._dummies[cost]


def _hash_random(cost: int) -> bytes:
    import bcrypt

    return bytes(bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(cost)))


def hash_password(password: str, cost: int = 10) -> str:
    """A bcrypt hash for ``basic_auth_users`` (``nvgpu-exporter hash-password``)."""
    import bcrypt

    if not password:
        raise ValueError("an empty password")
    if len(password.encode()) > 72:
        raise ValueError("bcrypt takes at most 72 bytes of password")
    return str(bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode())


class RateLimiter:
    """exporter-toolkit's ``rate_limit``: a token bucket of ``burst`` refilled every ``interval_s``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._tokens = 0.0
        self._stamp = clock()
        self._shape = (0.0, 0)

    def allow(self, interval_s: float, burst: int) -> bool:
        """Take one token; False when the bucket is empty (answer 429)."""
        if interval_s <= 0:
            return True
        now = self.clock()
        if self._shape != (interval_s, burst):
            self._shape, self._tokens, self._stamp = (interval_s, burst), float(burst), now
        self._tokens = min(float(burst), self._tokens + (now - self._stamp) / interval_s)
        self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
