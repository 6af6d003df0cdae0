"""The TLS side of the web config: the server context, built from the settings, and its reloads.

:func:`load_with_context` reads a web configuration file (:func:`exporter.supervisor.http.webconfig.load`, every
problem at once) and builds its TLS server context: certificate chain and key (files, or inline
PEM written to a private temporary directory for the moment ``ssl`` loads them), the client CA,
TLS versions, ciphers and the curve, ALPN ``http/1.1``.

:class:`WebConfigWatcher` re-reads the file, and the certificate, key and CA files it names, when
any of them changes (a Kubernetes Secret update, cert-manager rotation), at most once a second;
a new TLS context is then used for new connections. A change that does not load (a half-written
key, a typo) keeps the previous configuration and is logged once with every problem, and
``nvgpu_web_config_last_reload_successful`` turns 0.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable

from exporter.supervisor.http.webconfig import TlsSettings, WebConfig, WebConfigError, file_problem, load

__all__ = ["WebConfigWatcher", "build_context", "load_with_context", "log_cautions"]

# The web config's logger: schema, TLS and auth log under one name (operators filter on it).
log = logging.getLogger("exporter.supervisor.http.webconfig")


def load_with_context(path: str, *, require_client_cert: bool = False) -> WebConfig:
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
        WebConfigError: every problem of the file or the files it names
            (:func:`exporter.supervisor.http.webconfig.load`); when there is none, why the context cannot be built.
    """
    config = load(path)
    if config.tls is None:
        return config
    try:
        context = build_context(config.tls, require_client_cert)
    except WebConfigError as exc:
        raise WebConfigError([f"{config.path}: {problem}" for problem in exc.problems]) from None
    return dataclasses.replace(config, context=context)


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
            elif tls.client_ca_pem:
                ctx.load_verify_locations(cadata=tls.client_ca_pem)
            else:  # no client CA: the system's roots, as Go's crypto/tls does with ClientCAs nil
                ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        except (OSError, ssl.SSLError, ValueError) as exc:
            where = tls.client_ca_file or "tls_server_config.client_ca"
            raise WebConfigError(f"tls_server_config.client_ca_file {where}: {_reason(exc)}") from None
        required = tls.requires_client_cert and require_client_cert
        ctx.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    return ctx


def _load_chain(ctx: ssl.SSLContext, tls: TlsSettings) -> None:
    for key, file in (("cert_file", tls.cert_file), ("key_file", tls.key_file)):
        why = file_problem(key, file) if file else None
        if why:  # checked by load already; a file can go between the two
            raise WebConfigError(why)
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
        require_client_cert: see :func:`load_with_context`.
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
        self.current = load_with_context(path, require_client_cert=require_client_cert)
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
            new = load_with_context(self.path, require_client_cert=self.require_client_cert)
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
        log_cautions(new)
        return new


def log_cautions(config: WebConfig) -> None:
    """One WARNING per :attr:`WebConfig.cautions` entry (at start and after each reload)."""
    for caution in config.cautions:
        log.warning("web config %s: %s", config.path, caution, extra={"web_config": config.path})
