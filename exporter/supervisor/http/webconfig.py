"""The web configuration file (``--web.config.file``): its format, read strictly, every problem at once.

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
certificate, key or CA files are problems naming the key. :func:`load` reports every problem of a
file in one :class:`~exporter.supervisor.http.webmodel.WebConfigError` (as
:meth:`exporter.config.Config.from_env` does for the environment); only a file that cannot be read
as a YAML mapping stops at that one problem. Where Python's ``ssl`` module cannot do what a value
asks, the value is refused rather than approximated:

- ``client_auth_type`` ``RequestClientCert`` and ``RequireAnyClientCert`` (accept a certificate
  without verifying it; exporter-toolkit calls them insecure): OpenSSL verifies every certificate a
  client sends.
- ``curve_preferences`` with more than one curve: ``ssl`` sets one curve.
- ``http_server_config.http2``: accepted (``true`` is the toolkit's default), HTTP/1.1 is served.

What the toolkit accepts and does something surprising with is accepted too, as the toolkit does
it, and said in :attr:`~exporter.supervisor.http.webmodel.WebConfig.cautions` (logged at start and at each reload):

- ``VerifyClientCertIfGiven`` / ``RequireAndVerifyClientCert`` without ``client_ca_file`` or
  ``client_ca``: Go's ``crypto/tls`` then verifies client certificates against the host's system
  roots (``tls.Config.ClientCAs`` nil); so does this exporter (``load_default_certs``).
- ``rate_limit.burst: 0`` with an interval: ``golang.org/x/time/rate`` allows no request with a
  burst of 0, so the toolkit answers every request 429; so does this exporter (the probe paths
  excepted while ``NVGPU_WEB_PROBES_WITHOUT_AUTH`` is on).
- a header value YAML reads as a number or a boolean (``X-XSS-Protection: 1``): yaml.v2 fills the
  toolkit's ``map[string]string`` with the scalar's text, so the header is ``1`` here too.

The rest of the web edge builds on this: :mod:`exporter.supervisor.http.webtls` (the TLS context, reloads when a
file changes) and :mod:`exporter.supervisor.http.webauth` (basic auth, client SANs, the rate limit per request).
``tests/fixtures/webconfig/`` holds a corpus of good and bad files with the problems expected.
"""

from __future__ import annotations

import difflib
import os
import ssl
from collections.abc import Hashable, Mapping
from typing import Any

from exporter.common import durations, fileio
from exporter.supervisor.http.webmodel import (
    BCRYPT_HASH,
    BCRYPT_MAX_COST,
    BCRYPT_MIN_COST,
    CIPHERS,
    CLIENT_AUTH_TYPES,
    CURVES,
    HEADERS,
    HTTP_KEYS,
    RATE_KEYS,
    TLS_KEYS,
    TLS_VERSIONS,
    TOP_KEYS,
    UNSUPPORTED_CLIENT_AUTH,
    TlsSettings,
    WebConfig,
    WebConfigError,
)

__all__ = ["MAX_FILE_BYTES", "load", "parse_go_duration"]


# -- loading -------------------------------------------------------------------------------------


class _Problems:
    """The problems of one file, collected so that all of them are reported together."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.found: list[str] = []
        self.reason = "error"  # the first refused file's reason, for counting

    def add(self, text: str) -> None:
        self.found.append(f"{self.path}: {text}")


def load(path: str) -> WebConfig:
    """Read and validate a web configuration file and check every file it names.

    Builds nothing: :func:`exporter.supervisor.http.webtls.load_with_context` adds the TLS context (and the one
    problem building it can still find: a key that does not match its certificate, a bad PEM).
    Every file is opened without blocking and must be a regular file
    (:func:`exporter.common.fileio.open_checked`): a FIFO or a device node at any of these paths is
    a problem, not a wait.

    Args:
        path: the YAML file.

    Returns:
        The configuration, paths absolute, ``context`` None.

    Raises:
        WebConfigError: with every problem of the file (unknown keys, wrong values, missing or
            unreadable certificate, key or CA files); with the one reason when the file cannot be
            read, is not a regular file, is larger than 1 MiB, is not UTF-8, not YAML, not a
            mapping, or loading it fails in any other way (YAML nested thousands deep, a NUL
            byte in a path: every exception of the loader is a problem of the file, never a
            traceback).
    """
    path = os.path.abspath(path)
    try:
        return _load(path)
    except WebConfigError:
        raise
    except RecursionError:
        raise WebConfigError(f"{path}: nested too deeply to be a web config file") from None
    except Exception as exc:  # noqa: BLE001 - any failure of the loader is a problem of the file
        raise WebConfigError(f"{path}: cannot be loaded ({type(exc).__name__}: {exc})") from None


def _load(path: str) -> WebConfig:
    p = _Problems(path)
    data = _read(p)
    _check_keys(p, data, TOP_KEYS, "")
    tls = _tls(p, os.path.dirname(path), _mapping(p, data, "tls_server_config"))
    http2, headers = _http(p, _mapping(p, data, "http_server_config"))
    users = _users(p, data.get("basic_auth_users"))
    rate_interval_s, rate_burst = _rate(p, _mapping(p, data, "rate_limit"))
    if p.found:
        raise WebConfigError(p.found, p.reason)
    cautions = []
    if tls is not None and tls.verifies_against_system_roots:
        cautions.append(
            f"{_TLS}client_auth_type {tls.client_auth} without client_ca_file: client certificates are verified "
            "against this system's CA roots (as exporter-toolkit does); give client_ca_file to trust your own CA only"
        )
    if rate_interval_s and rate_burst == 0:
        cautions.append(
            "rate_limit.burst is 0: every request is answered 429 (as exporter-toolkit does), the probe paths "
            "excepted while NVGPU_WEB_PROBES_WITHOUT_AUTH is true"
        )
    return WebConfig(path, tls, users, headers, http2, rate_interval_s, rate_burst, tuple(cautions))


MAX_FILE_BYTES = 1 << 20  # the web config file, and each certificate, key or CA file it names


def _read(p: _Problems) -> dict[str, Any]:
    try:
        raw = fileio.read_bytes(p.path, MAX_FILE_BYTES - 1)
    except fileio.FileRefused as exc:
        if exc.reason == "too_large":
            raise WebConfigError(f"{p.path}: larger than 1 MiB; is it the right file?", exc.reason) from None
        raise WebConfigError(f"cannot read {p.path!r}: {exc.detail}", exc.reason) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WebConfigError(f"{p.path}: not UTF-8 ({exc})") from None
    return _parse_yaml(p, text)


def _parse_yaml(p: _Problems, text: str) -> dict[str, Any]:
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that reports duplicate keys (yaml.v2 UnmarshalStrict refuses them too)."""

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                break  # construct_mapping says "found unhashable key", a YAMLError
            if key in seen:
                p.add(f"line {key_node.start_mark.line + 1}: duplicate key {key!r}")
            seen.add(key)
        return dict(loader.construct_mapping(node, deep=True))

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{p.path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WebConfigError(f"{p.path}: expected a mapping with keys {', '.join(TOP_KEYS)}, got {type(data).__name__}")
    _header_texts(text, data)
    return data


def _header_texts(text: str, data: dict[str, Any]) -> None:
    """Header values that YAML read as a number or a boolean become the scalar's text, as yaml.v2
    fills the toolkit's ``map[string]string`` (``X-XSS-Protection: 1`` is the header ``1``)."""
    import yaml

    headers = (
        (data.get("http_server_config") or {}).get("headers")
        if isinstance(data.get("http_server_config"), dict)
        else None
    )
    if not isinstance(headers, dict) or not any(isinstance(v, (bool, int, float)) for v in headers.values()):
        return
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    for key in ("http_server_config", "headers"):
        node = _child(node, key)
    if not isinstance(node, yaml.MappingNode):
        return
    for key_node, value_node in node.value:
        name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if isinstance(value_node, yaml.ScalarNode) and isinstance(headers.get(name), (bool, int, float)):
            headers[name] = value_node.value


def _child(node: Any, key: str) -> Any:
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return None
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return value_node
    return None


def _check_keys(p: _Problems, data: Mapping[Any, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]}?" if close else f" (known: {', '.join(allowed)})"
            p.add(f"unknown key {where}{key!r}{hint}")


def _mapping(p: _Problems, data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        p.add(f"{key} must be a mapping, got {type(value).__name__}")
        return {}
    return value


def _string(p: _Problems, where: str, value: Any) -> str | None:
    if not isinstance(value, str):
        p.add(f"{where} must be a string, got {value!r}")
        return None
    return value


def _strings(p: _Problems, where: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        p.add(f"{where} must be a list of strings, got {value!r}")
        return []
    return list(value)


def _bool(p: _Problems, where: str, value: Any, default: bool) -> bool:
    if not isinstance(value, bool):
        p.add(f"{where} must be true or false, got {value!r}")
        return default
    return value


# -- tls_server_config ---------------------------------------------------------------------------

_TLS = "tls_server_config."
_NOT_STRINGS = ("client_allowed_sans", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites")
_STRING_TLS_KEYS = tuple(k for k in TLS_KEYS if k not in _NOT_STRINGS)
_SOURCES = (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file"))


def _tls(p: _Problems, base: str, data: dict[str, Any]) -> TlsSettings | None:
    if not data:
        return None
    _check_keys(p, data, TLS_KEYS, _TLS)
    values: dict[str, str] = {}
    for key in _STRING_TLS_KEYS:
        text = _string(p, _TLS + key, data[key]) if key in data else None
        if text is not None:
            values[key] = text
    wrong = {key for key in _STRING_TLS_KEYS if key in data and key not in values}
    files = _tls_files(p, base, values, wrong)
    client_auth = _client_auth(p, values)
    sans = _strings(p, _TLS + "client_allowed_sans", data.get("client_allowed_sans"))
    if sans and client_auth not in (None, "RequireAndVerifyClientCert"):
        p.add(f"{_TLS}client_allowed_sans needs client_auth_type RequireAndVerifyClientCert")
    min_version, max_version = _versions(p, values)
    prefer = _bool(p, _TLS + "prefer_server_cipher_suites", data.get("prefer_server_cipher_suites", True), True)
    return TlsSettings(
        cert_file=files["cert_file"],
        key_file=files["key_file"],
        cert_pem=values.get("cert", ""),
        key_pem=values.get("key", ""),
        client_auth=client_auth or "NoClientCert",
        client_ca_file=files["client_ca_file"],
        client_ca_pem=values.get("client_ca", ""),
        client_allowed_sans=tuple(sans),
        min_version=min_version,
        max_version=max_version,
        ciphers=_ciphers(p, data.get("cipher_suites")),
        prefer_server_ciphers=prefer,
        curve=_curve(p, data.get("curve_preferences")),
    )


def _tls_files(p: _Problems, base: str, values: Mapping[str, str], wrong: set[str]) -> dict[str, str]:
    """cert/key/client CA: inline or a file, not both; cert and key present (a value of the wrong
    type is its own problem, not also a missing one); the files named readable."""
    for inline, file_key in _SOURCES:
        if values.get(inline) and values.get(file_key):
            p.add(f"give {_TLS}{inline} or {_TLS}{file_key}, not both")
    for inline, file_key in _SOURCES[:2]:
        if not (values.get(inline) or values.get(file_key) or wrong & {inline, file_key}):
            p.add(f"{_TLS}{file_key} (or {inline}) is missing")
    files = {file_key: _resolve(base, values.get(file_key, "")) for _inline, file_key in _SOURCES}
    for key in ("cert_file", "key_file", "client_ca_file"):
        if files[key]:
            _file_problem(p, key, files[key])
    return files


def _file_problem(p: _Problems, key: str, file: str) -> None:
    """A problem when ``tls_server_config.<key>`` (an absolute path) cannot be read by this
    process: it does not exist, cannot be opened, is not a regular file (a FIFO would block the
    reader) or is larger than 1 MiB. Opens without blocking (:func:`exporter.common.fileio.open_checked`)."""
    try:
        fd, _st = fileio.open_checked(file, MAX_FILE_BYTES)
    except fileio.FileRefused as exc:
        p.add(f"{_TLS}{key} {file} {exc.detail}")
        if p.reason == "error":
            p.reason = exc.reason
        return
    os.close(fd)


def _client_auth(p: _Problems, values: Mapping[str, str]) -> str | None:
    """The client_auth_type when valid (None after a problem), checked against the client CA."""
    client_auth = values.get("client_auth_type") or "NoClientCert"
    if client_auth in UNSUPPORTED_CLIENT_AUTH:
        p.add(
            f"{_TLS}client_auth_type {client_auth} is not supported: it accepts a client certificate "
            "without verifying it (exporter-toolkit calls it insecure), and OpenSSL verifies every certificate "
            "it is sent; use RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file"
        )
        return None
    if client_auth not in CLIENT_AUTH_TYPES:
        p.add(f"{_TLS}client_auth_type {client_auth!r} is not one of {', '.join(CLIENT_AUTH_TYPES)}")
        return None
    has_ca = bool(values.get("client_ca") or values.get("client_ca_file"))
    if has_ca and client_auth == "NoClientCert":
        p.add(
            f"{_TLS}client_ca_file is set but client_auth_type is NoClientCert; "
            "set client_auth_type: RequireAndVerifyClientCert"
        )
    return client_auth  # verifying without a CA: the system roots, as Go's crypto/tls does (cautions)


def _versions(p: _Problems, values: Mapping[str, str]) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    found: dict[str, ssl.TLSVersion] = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = values.get(key, default)
        if name in TLS_VERSIONS:
            found[key] = TLS_VERSIONS[name]
        else:
            p.add(f"{_TLS}{key} {name!r} is not one of {', '.join(TLS_VERSIONS)}")
    low = found.get("min_version", ssl.TLSVersion.TLSv1_2)
    high = found.get("max_version", ssl.TLSVersion.TLSv1_3)
    if len(found) == 2 and low > high:
        p.add(f"{_TLS}min_version is above max_version")
    return low, high


def _ciphers(p: _Problems, value: Any) -> str:
    ciphers: list[str] = []
    for name in _strings(p, _TLS + "cipher_suites", value):
        if name not in CIPHERS:
            close = difflib.get_close_matches(name, list(CIPHERS), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            p.add(f"{_TLS}cipher_suites: unknown or insecure cipher {name!r}{hint}")
        elif CIPHERS[name] and CIPHERS[name] not in ciphers:
            ciphers.append(CIPHERS[name])
    return ":".join(ciphers)


def _curve(p: _Problems, value: Any) -> str:
    curves = _strings(p, _TLS + "curve_preferences", value)
    for name in curves:
        if name not in CURVES:
            p.add(f"{_TLS}curve_preferences: unknown curve {name!r} ({', '.join(CURVES)})")
    if len(curves) > 1:
        p.add(f"{_TLS}curve_preferences: Python's ssl module sets one curve; give one of {', '.join(curves)}")
    return CURVES.get(curves[0], "") if curves else ""


def _resolve(base: str, path: str) -> str:
    return os.path.normpath(os.path.join(base, path)) if path else ""


# -- http_server_config, basic_auth_users, rate_limit --------------------------------------------


def _http(p: _Problems, data: dict[str, Any]) -> tuple[bool, dict[str, str]]:
    _check_keys(p, data, HTTP_KEYS, "http_server_config.")
    http2 = _bool(p, "http_server_config.http2", data.get("http2", True), True)
    raw = data.get("headers") or {}
    if not isinstance(raw, dict):
        p.add("http_server_config.headers must be a mapping")
        return http2, {}
    headers = {}
    for name, value in raw.items():
        if name not in HEADERS:
            p.add(f"http_server_config.headers: {name!r} cannot be set (settable: {', '.join(HEADERS)})")
            continue
        text = _string(p, f"http_server_config.headers.{name}", value)
        if text is None:
            continue
        allowed = HEADERS[name]
        if text and allowed and text.lower() not in allowed:
            p.add(f"http_server_config.headers.{name}: {text!r} is not one of {', '.join(allowed)}")
        elif any(c in text for c in "\r\n\0"):
            p.add(f"http_server_config.headers.{name}: line breaks are not allowed")
        elif text:
            headers[name] = text
    return http2, headers


def _users(p: _Problems, data: Any) -> dict[str, bytes]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        p.add("basic_auth_users must be a mapping of user name to bcrypt hash")
        return {}
    users = {}
    for user, hashed in data.items():
        if not isinstance(user, str) or not user or ":" in user:
            p.add(f"basic_auth_users: user name {user!r} must be a non-empty string without ':'")
            continue
        text = _string(p, f"basic_auth_users.{user}", hashed)
        if text is None:
            continue
        m = BCRYPT_HASH.fullmatch(text)
        if m is None:
            p.add(
                f"basic_auth_users.{user} is not a bcrypt hash ($2y$10$ followed by 53 characters); "
                "make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'"
            )
        elif not BCRYPT_MIN_COST <= int(m.group(1)) <= BCRYPT_MAX_COST:
            p.add(_cost_problem(user, int(m.group(1))))
        else:
            users[user] = text.encode()
    return users


def _cost_problem(user: str, cost: int) -> str:
    if cost < BCRYPT_MIN_COST:
        return f"basic_auth_users.{user}: bcrypt cost {cost} is below {BCRYPT_MIN_COST}, the lowest bcrypt defines"
    seconds = 0.07 * 2 ** (cost - 10)
    took = f"{seconds / 86400:.1f} days" if seconds >= 86400 else f"{seconds:.0f} s"
    return (
        f"basic_auth_users.{user}: bcrypt cost {cost} is above {BCRYPT_MAX_COST}, the most accepted: every check of "
        f"a password not yet verified (each wrong one) would hold a core for about {took} (cost 10: ~70 ms, "
        f"doubling with each step); make a new hash with: nvgpu-exporter hash-password --cost 12"
    )


def _rate(p: _Problems, data: dict[str, Any]) -> tuple[float, int]:
    if not data:
        return 0.0, 0
    _check_keys(p, data, RATE_KEYS, "rate_limit.")
    try:
        seconds = parse_go_duration(p.path, "rate_limit.interval", data.get("interval", "0"))
    except WebConfigError as exc:
        p.found.extend(exc.problems)
        seconds = 0.0
    burst = data.get("burst", 0)
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 0:
        p.add(f"rate_limit.burst must be a non-negative integer, got {burst!r}")
        return seconds, 0
    return seconds, burst  # burst 0 refuses every request, as the toolkit's limiter does (cautions)


def parse_go_duration(path: str, where: str, value: Any) -> float:
    """A Go duration (``100ms``, ``1m30s``, ``0``) in seconds.

    Args:
        path: the file, for the message.
        where: the key, for the message.
        value: the YAML value (a string, or the integer 0).

    Raises:
        WebConfigError: not a Go duration (negative durations included).
    """
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        return 0.0
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        seconds = durations.parse_go_duration(value)
    except ValueError:
        seconds = -1.0
    if seconds < 0:
        raise WebConfigError(f"{path}: {where} must be a duration such as 100ms, 1s or 1m30s, got {value!r}")
    return seconds
