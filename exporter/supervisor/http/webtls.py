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

import concurrent.futures
import dataclasses
import functools
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable

from exporter.common import fileio
from exporter.supervisor.http.webconfig import MAX_FILE_BYTES, load
from exporter.supervisor.http.webmodel import TlsSettings, WebConfig, WebConfigError

__all__ = ["WebConfigWatcher", "build_context", "load_bounded", "load_with_context", "log_cautions"]

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
        raise WebConfigError([f"{config.path}: {problem}" for problem in exc.problems], exc.reason) from None
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
        ca = _pem("client_ca_file", tls.client_ca_file) if tls.client_ca_file else tls.client_ca_pem.encode()
        try:
            if ca:
                ctx.load_verify_locations(cadata=_cadata(ca))
            else:  # no client CA: the system's roots, as Go's crypto/tls does with ClientCAs nil
                ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        except (OSError, ssl.SSLError, ValueError) as exc:
            where = tls.client_ca_file or "tls_server_config.client_ca"
            raise WebConfigError(f"tls_server_config.client_ca_file {where}: {_reason(exc)}") from None
        required = tls.requires_client_cert and require_client_cert
        ctx.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    return ctx


def _load_chain(ctx: ssl.SSLContext, tls: TlsSettings) -> None:
    """Certificate chain and key into ``ctx``. Files are read here, without blocking and bounded
    (:func:`exporter.common.fileio.read_bytes`: OpenSSL's own ``fopen`` would wait forever on a
    FIFO), and what was read is handed to ``ssl`` through a private temporary directory, as inline
    PEM is (``ssl`` loads chains only from files)."""
    cert_pem = tls.cert_pem.encode() if tls.cert_pem else _pem("cert_file", tls.cert_file)
    key_pem = tls.key_pem.encode() if tls.key_pem else _pem("key_file", tls.key_file)
    with tempfile.TemporaryDirectory(prefix="nvgpu-tls-") as tmp:
        os.chmod(tmp, 0o700)
        cert = _write_private(tmp, "cert.pem", cert_pem)
        key = _write_private(tmp, "key.pem", key_pem)
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            if tls.cert_file and tls.key_file:
                raise WebConfigError(
                    f"tls_server_config: cannot load cert_file {tls.cert_file} with key_file {tls.key_file}: "
                    f"{_reason(exc)}"
                ) from None
            raise WebConfigError(f"tls_server_config: cannot load the certificate and key: {_reason(exc)}") from None


def _pem(key: str, file: str) -> bytes:
    """A certificate, key or CA file's bytes (checked by load already; a file can change between)."""
    try:
        return fileio.read_bytes(file, MAX_FILE_BYTES)
    except fileio.FileRefused as exc:
        raise WebConfigError(f"tls_server_config.{key} {file} {exc.detail}", exc.reason) from None


def _write_private(directory: str, name: str, data: bytes) -> str:
    target = os.path.join(directory, name)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return target


def _cadata(data: bytes) -> str | bytes:
    """``load_verify_locations(cadata=)`` takes PEM as text, DER as bytes."""
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        return data


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return f"{exc.reason} ({exc.library or 'ssl'})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# -- reloading -----------------------------------------------------------------------------------

LOAD_DEADLINE_S = 5.0  # reading the web config and its files, start or reload (a hung mount: no answer)


def load_bounded(
    path: str,
    *,
    require_client_cert: bool = False,
    deadline_s: float = LOAD_DEADLINE_S,
    runner: fileio.Runner | None = None,
) -> WebConfig:
    """:func:`load_with_context` on a file-reading thread, waiting at most ``deadline_s``.

    Raises:
        WebConfigError: every problem :func:`load_with_context` finds; no answer within the
            deadline (the file, or one it names, sits on a hung mount: the thread is abandoned);
            any other exception while loading, as one problem naming the file.
    """
    where = os.path.abspath(path)
    try:
        return (runner or fileio.default_runner()).call(
            functools.partial(load_with_context, require_client_cert=require_client_cert), path, deadline_s=deadline_s
        )
    except WebConfigError:
        raise
    except fileio.TimedOut:
        raise WebConfigError(
            f"{where}: reading it and the files it names did not finish within {deadline_s:g} s (a hung mount?)",
            "timeout",
        ) from None
    except Exception as exc:  # noqa: BLE001 - any failure of the loader is a problem of the file
        raise WebConfigError(f"{where}: cannot be loaded ({type(exc).__name__}: {exc})") from None


Signature = tuple[tuple[str, tuple[int, int, int, int] | None], ...]


def _signature(files: tuple[str, ...]) -> Signature:
    out: list[tuple[str, tuple[int, int, int, int] | None]] = []
    for f in files:
        try:
            st = os.stat(f)  # follows links: a Secret update swaps the ..data link
            out.append((f, (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)))
        except (OSError, ValueError):
            out.append((f, None))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class _Checked:
    """What one look at the files found (made on the file-reading thread)."""

    signature: Signature
    config: WebConfig | None = None  # loaded: the files changed and load
    error: WebConfigError | None = None  # the files changed and do not load


class WebConfigWatcher:
    """The current web configuration, re-read when its files change.

    Nothing here blocks the event loop: :meth:`refresh` (called for every request and connection,
    and every ``check_every_s`` by :meth:`exporter.supervisor.http.httpedge.HttpEdge.run`) returns
    the configuration in force at once and, at most once per ``check_every_s``, hands a look at
    the files (``stat``, then a reload when they changed) to a file-reading thread
    (:class:`exporter.common.fileio.Runner`); its result is taken by a later call. A look that has
    not answered within ``deadline_s`` (a file on a hung mount) is abandoned and counted like a
    reload that failed. A failed reload keeps the previous configuration, sets
    :attr:`last_reload_ok` False, counts ``nvgpu_file_read_failures_total{input="web_config"}``
    and is logged once per state of the files.

    Args:
        path: the web configuration file.
        require_client_cert: see :func:`load_with_context`.
        check_every_s: look at the files at most this often.
        clock: monotonic clock (tests).
        deadline_s: a look at the files (and the first load) must answer within this.
        runner: where the files are read (tests; default: the process's file-reading runner).

    Raises:
        WebConfigError: the first load failed (the exporter does not start).
    """

    def __init__(
        self,
        path: str,
        require_client_cert: bool = False,
        check_every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        deadline_s: float = LOAD_DEADLINE_S,
        runner: fileio.Runner | None = None,
    ) -> None:
        self.path = path
        self.require_client_cert = require_client_cert
        self.check_every_s = check_every_s
        self.clock = clock
        self.deadline_s = deadline_s
        self.runner = runner or fileio.Runner("nvgpu-web-config", deadline_s)
        self.current = load_bounded(
            path, require_client_cert=require_client_cert, deadline_s=deadline_s, runner=self.runner
        )
        self._signature = _signature(self.current.files())
        self._checked = clock()
        self.last_reload_ok = True
        self.last_reload_time = time.time()
        self.reloads = 0
        self._failed_signature: Signature | None = None
        self._look: concurrent.futures.Future[_Checked] | None = None
        self._look_started = 0.0
        self._timed_out_logged = False

    @property
    def looking(self) -> bool:
        """A look at the files is in flight (its answer not yet taken)."""
        return self._look is not None

    def refresh(self) -> WebConfig:
        """The configuration to use now, at once; takes a finished look at the files, and starts
        the next one when one is due."""
        now = self.clock()
        look = self._look
        if look is not None:
            if look.done():
                self._look = None
                self._take(look)
            elif now - self._look_started > self.deadline_s:
                self._look = None
                self.runner.give_up(look)
                self._timed_out()
            return self.current
        if now - self._checked >= self.check_every_s:
            self._checked = now
            self._look_started = now
            self._look = self.runner.submit(self._look_at_files, deadline_s=self.deadline_s)
        return self.current

    def check(self) -> WebConfig:
        """Look at the files now and wait for the answer (at most ``deadline_s``), for callers
        that are not the event loop (tests, tools); the configuration to use then."""
        self._checked = self.clock()
        try:
            checked = self.runner.call(self._look_at_files, deadline_s=self.deadline_s)
        except fileio.TimedOut:
            self._timed_out()
        else:
            self._apply(checked)
        return self.current

    def _look_at_files(self) -> _Checked:
        """On the file-reading thread: stat the files; reload when they changed."""
        signature = _signature(self.current.files())
        if signature in (self._signature, self._failed_signature):
            return _Checked(signature)  # unchanged, or still the same broken files: logged once already
        try:
            new = load_with_context(self.path, require_client_cert=self.require_client_cert)
        except WebConfigError as exc:
            return _Checked(signature, error=exc)
        except RecursionError:
            return _Checked(signature, error=WebConfigError(f"{self.path}: nested too deeply to be a web config file"))
        except Exception as exc:  # noqa: BLE001 - any failure of the loader keeps the previous config
            return _Checked(
                signature, error=WebConfigError(f"{self.path}: cannot be loaded ({type(exc).__name__}: {exc})")
            )
        return _Checked(_signature(new.files()), config=new)

    def _take(self, look: concurrent.futures.Future[_Checked]) -> None:
        try:
            checked = look.result()
        except fileio.TimedOut:  # too many looks still stuck
            self._timed_out()
            return
        except Exception as exc:  # noqa: BLE001 - a bug of ours: keep the configuration, say why
            self._failed(WebConfigError(f"{self.path}: {type(exc).__name__}: {exc}"), None)
            return
        self._apply(checked)

    def _apply(self, checked: _Checked) -> None:
        if checked.error is not None:
            self._failed(checked.error, checked.signature)
        elif checked.config is not None:
            new = checked.config
            self.current = new
            self._signature = checked.signature
            self._failed_signature = None
            self._timed_out_logged = False
            self.last_reload_ok = True
            self.last_reload_time = time.time()
            self.reloads += 1
            log.info("web config %s reloaded: %s", self.path, new.describe(), extra={"web_config": self.path})
            log_cautions(new)

    def _timed_out(self) -> None:
        fileio.count_failure("web_config", fileio.TimedOut())
        self.last_reload_ok = False
        if not self._timed_out_logged:
            self._timed_out_logged = True
            log.error(
                "web config %s: looking at it and the files it names did not finish within %g s (a hung mount?); "
                "keeping the previous one (%s)",
                self.path,
                self.deadline_s,
                self.current.describe(),
                extra={"web_config": self.path},
            )

    def _failed(self, exc: WebConfigError, signature: Signature | None) -> None:
        self._failed_signature = signature
        self.last_reload_ok = False
        fileio.count_failure("web_config", exc)
        log.error(
            "web config %s changed but does not load (%s); keeping the previous one (%s)",
            self.path,
            exc,
            self.current.describe(),
            extra={"web_config": self.path},
        )


def log_cautions(config: WebConfig) -> None:
    """One WARNING per :attr:`WebConfig.cautions` entry (at start and after each reload)."""
    for caution in config.cautions:
        log.warning("web config %s: %s", config.path, caution, extra={"web_config": config.path})
