"""The web configuration (``--web.config.file``) as values: what a loaded file means.

:class:`WebConfig` and its :class:`TlsSettings`, :class:`WebConfigError` (every problem of a file),
and the vocabulary of exporter-toolkit's format (prometheus/exporter-toolkit
``docs/web-configuration.md``) that the reader (:mod:`exporter.supervisor.http.webconfig`) checks
against: the keys of each section, TLS versions, cipher suites and curves by their Go names, the
security headers, bcrypt hashes and the costs accepted.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "BCRYPT_HASH",
    "BCRYPT_MAX_COST",
    "BCRYPT_MIN_COST",
    "TlsSettings",
    "WebConfig",
    "WebConfigError",
]


class WebConfigError(ValueError):
    """The web configuration file (or a file it names) is not usable.

    Attributes:
        problems: every problem found, one sentence each; each problem of a file starts with the
            file's absolute path. ``str()`` joins them with ``"; "``.
        reason: how the failure is counted (:data:`exporter.common.fileio.REASONS`): the reason a
            file was refused (``not_regular``, ``too_large``, ``timeout``), else ``error``.
    """

    def __init__(self, problems: str | Sequence[str], reason: str = "error") -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.reason = reason
        super().__init__("; ".join(self.problems))


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
# bcrypt costs accepted in basic_auth_users (and made by `hash-password --cost`). What users of
# exporter-toolkit's format write: 10 (its documentation's `htpasswd -nBC 10`, Go's
# bcrypt.DefaultCost), 12 (Python's bcrypt.gensalt() default, as in the Prometheus documentation's
# Python snippet), 5 (htpasswd's own default; Apache htpasswd takes 4 to 17). Every check of a
# password not yet verified (the first scrape after a start, every wrong password) runs one
# bcrypt: about 70 ms at cost 10 (exporter-toolkit's documentation; 64 ms measured on this
# project's 2-core development VM), doubling with each step. 14 (about 1 s) keeps a first scrape
# well inside Prometheus's default 10 s scrape timeout on a slower core; cost 31 would be about
# 1.7 days of one core per wrong password.
BCRYPT_MIN_COST = 4
BCRYPT_MAX_COST = 14


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
    def verifies_against_system_roots(self) -> bool:
        """Client certificates are verified, and no client CA is given: the system's roots are used."""
        return self.verifies_clients and not (self.client_ca_file or self.client_ca_pem)

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
        cautions: what the file asks for that works as exporter-toolkit does but may surprise (client
            certificates against the system roots, a rate limit that refuses everything), one
            sentence each; logged at start and at each reload.
        context: the TLS server context built from ``tls`` by
            :func:`exporter.supervisor.http.webtls.load_with_context` (None without TLS, and from
            :func:`exporter.supervisor.http.webconfig.load`, which builds nothing). Client certificates are
            requested and verified if given (``CERT_OPTIONAL``) when ``client_auth_type`` verifies them;
            :class:`exporter.supervisor.http.webtls.WebConfigWatcher` asks for ``CERT_REQUIRED`` when probes must
            present one too.
    """

    path: str
    tls: TlsSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    http2: bool = True
    rate_interval_s: float = 0.0
    rate_burst: int = 0
    cautions: tuple[str, ...] = ()
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
                roots = " against the system roots" if self.tls.verifies_against_system_roots else ""
                parts.append(f"client certificates {self.tls.client_auth}{roots}")
        parts.append(f"basic auth for {len(self.users)} user(s)" if self.users else "no basic auth")
        if self.rate_interval_s:
            parts.append(f"rate limit {self.rate_burst} per {self.rate_interval_s:g} s")
        return ", ".join(parts)
