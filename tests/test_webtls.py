"""exporter.supervisor.http.webtls: the TLS server context of a web config, and reloads when its files change."""

from __future__ import annotations

import logging
import os
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
from tls_material import USER, Material, bcrypt_hash, make_material
from waiting import wait_until

from exporter.supervisor.http.webmodel import WebConfig, WebConfigError
from exporter.supervisor.http.webtls import WebConfigWatcher, load_with_context


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Material:
    return make_material(tmp_path_factory.mktemp("tls"))


def write(directory: Path, text: str, name: str = "web.yml") -> str:
    path = directory / name
    path.write_text(text)
    return str(path)


def full_config(tls: Material, users: str = "") -> str:
    return f"""
tls_server_config:
  cert_file: {tls.path("server.crt")}
  key_file: {tls.path("server.key")}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {tls.path("ca.crt")}
  client_allowed_sans: [prometheus.monitoring.svc]
  min_version: TLS12
  max_version: TLS13
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: true
  curve_preferences: [CurveP256]
http_server_config:
  http2: true
  headers:
    X-Content-Type-Options: nosniff
    Strict-Transport-Security: max-age=31536000
basic_auth_users:
  {USER}: {bcrypt_hash()}
{users}
rate_limit:
  interval: 100ms
  burst: 20
"""


def test_a_full_exporter_toolkit_file_loads(tls: Material, tmp_path: Path) -> None:
    cfg = load_with_context(write(tmp_path, full_config(tls)))
    assert cfg.tls is not None and cfg.context is not None
    assert cfg.tls.requires_client_cert and cfg.tls.client_allowed_sans == ("prometheus.monitoring.svc",)
    assert cfg.tls.min_version is ssl.TLSVersion.TLSv1_2 and cfg.tls.ciphers == "ECDHE-ECDSA-AES128-GCM-SHA256"
    assert cfg.tls.curve == "prime256v1"
    assert cfg.context.verify_mode is ssl.CERT_OPTIONAL  # refused in HTTP so probes can pass
    assert load_with_context(cfg.path, require_client_cert=True).context.verify_mode is ssl.CERT_REQUIRED  # type: ignore[union-attr]
    assert set(cfg.users) == {USER} and cfg.headers["X-Content-Type-Options"] == "nosniff"
    assert cfg.rate_interval_s == pytest.approx(0.1) and cfg.rate_burst == 20
    assert cfg.files() == (cfg.path, tls.path("server.crt"), tls.path("server.key"), tls.path("ca.crt"))
    assert "TLS" in cfg.describe() and "basic auth for 1 user(s)" in cfg.describe()


def test_inline_pem_works_like_files(tls: Material, tmp_path: Path) -> None:
    cert = (tls.dir / "server.crt").read_text()
    key = (tls.dir / "server.key").read_text()
    ca = (tls.dir / "ca.crt").read_text()
    indent = lambda pem: "\n".join("    " + line for line in pem.splitlines())  # noqa: E731
    text = (
        "tls_server_config:\n"
        f"  cert: |\n{indent(cert)}\n  key: |\n{indent(key)}\n  client_ca: |\n{indent(ca)}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
    )
    cfg = load_with_context(write(tmp_path, text))
    assert cfg.context is not None and cfg.context.verify_mode is ssl.CERT_OPTIONAL
    assert not any(p.name.startswith("nvgpu-tls-") for p in Path(os.environ.get("TMPDIR", "/tmp")).iterdir())


def test_mismatched_key_and_certificate(tls: Material, tmp_path: Path) -> None:
    text = f"tls_server_config: {{cert_file: {tls.path('server.crt')}, key_file: {tls.path('client.key')}}}\n"
    with pytest.raises(WebConfigError, match="cannot load cert_file"):
        load_with_context(write(tmp_path, text))


def test_plain_http_has_no_context(tmp_path: Path) -> None:
    assert load_with_context(write(tmp_path, f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n")).context is None


# -- reloads ---------------------------------------------------------------------------------------


def settled(watcher: WebConfigWatcher) -> WebConfig:
    """refresh() as the event loop calls it, until its look at the files is taken: the first call
    starts a look on the file-reading thread, a later one takes the answer."""
    watcher.refresh()
    wait_until(lambda: (watcher.refresh(), not watcher.looking)[1], 10, "the look at the files", every=0.01)
    return watcher.current


def test_watcher_reloads_on_change_and_keeps_the_last_good(tls: Material, tmp_path: Path) -> None:
    now = [0.0]
    path = write(tmp_path, f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n")
    watcher = WebConfigWatcher(path, clock=lambda: now[0])
    assert set(watcher.current.users) == {USER} and watcher.last_reload_ok
    # a new user: picked up at the next check
    Path(path).write_text(f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n  grafana: {bcrypt_hash()}\n")
    assert set(watcher.refresh().users) == {USER} and not watcher.looking, "checked at most once a second"
    now[0] += 1.5
    assert set(settled(watcher).users) == {USER, "grafana"} and watcher.reloads == 1
    # a broken edit: the previous configuration stays, reload marked failed
    Path(path).write_text("basic_auth_users: {grafana: plaintext}\n")
    now[0] += 1.5
    assert set(settled(watcher).users) == {USER, "grafana"}
    assert watcher.last_reload_ok is False
    # fixed again
    Path(path).write_text(f"basic_auth_users:\n  alice: {bcrypt_hash()}\n")
    now[0] += 1.5
    assert set(settled(watcher).users) == {"alice"} and watcher.last_reload_ok is True


def test_watcher_follows_certificate_rotation(tls: Material, tmp_path: Path) -> None:
    """A Secret update replaces the certificate files; the next context serves the new one."""
    for name in ("server.crt", "server.key", "client.crt", "client.key"):
        (tmp_path / name).write_bytes((tls.dir / name).read_bytes())
    now = [0.0]
    path = write(tmp_path, "tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
    watcher = WebConfigWatcher(path, clock=lambda: now[0])
    first = watcher.current.context
    # rotate: the "client" pair stands in for a new server certificate
    (tmp_path / "server.crt").write_bytes((tls.dir / "client.crt").read_bytes())
    (tmp_path / "server.key").write_bytes((tls.dir / "client.key").read_bytes())
    now[0] += 2
    assert settled(watcher).context is not first and watcher.reloads == 1
    # a half-written rotation (new certificate, old key) keeps the last good context
    (tmp_path / "server.crt").write_bytes((tls.dir / "server.crt").read_bytes())
    now[0] += 2
    assert settled(watcher).context is watcher.current.context and watcher.last_reload_ok is False


def test_a_failed_reload_logs_every_problem_once(
    tls: Material, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    path = write(tmp_path, f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n")
    watcher = WebConfigWatcher(path, clock=lambda: now[0])
    Path(path).write_text("tls_server_config: {cert_file: gone.crt, key_file: gone.key}\nbasic_auth_users: {a: b}\n")
    with caplog.at_level(logging.ERROR, logger="exporter.supervisor.http.webconfig"):
        for _ in range(3):
            now[0] += 1.5
            assert set(settled(watcher).users) == {USER}
    (record,) = caplog.records
    message = record.getMessage()
    for says in (
        "cert_file",
        "gone.crt does not exist",
        "gone.key does not exist",
        "basic_auth_users.a is not a bcrypt",
    ):
        assert says in message, message
    assert watcher.last_reload_ok is False


# -- nothing blocks the caller; every failure keeps the last good configuration --------------------


def test_refresh_never_waits_for_files_on_a_hung_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A look at the files that does not answer (stat on a hung mount) never holds refresh(): the
    configuration in force is returned at once; past the deadline the look is abandoned, counted
    (timeout), logged once and the reload marked failed; once the mount answers, a changed file
    loads again."""
    from exporter.common import fileio
    from exporter.supervisor.http import webtls

    monkeypatch.setattr(fileio, "FAILURES", fileio.FAILURES.__class__())
    now = [0.0]
    path = write(tmp_path, f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n")
    watcher = WebConfigWatcher(path, clock=lambda: now[0], deadline_s=5.0)
    hung = threading.Event()
    real = webtls._signature

    def stat_on_a_hung_mount(files: tuple[str, ...]) -> Any:
        hung.wait()  # what stat(2) does on a hung NFS mount: the kernel waits
        return real(files)

    monkeypatch.setattr(webtls, "_signature", stat_on_a_hung_mount)
    Path(path).write_text(f"basic_auth_users:\n  grafana: {bcrypt_hash()}\n")
    with caplog.at_level(logging.ERROR, logger="exporter.supervisor.http.webconfig"):
        for step in range(4):  # a refresh() every 2 s of the fake clock: none of them waits
            now[0] += 2.0
            assert set(watcher.refresh().users) == {USER}, step
        assert watcher.last_reload_ok is False and fileio.FAILURES[("web_config", "timeout")] >= 1
        now[0] += 2.0
        watcher.refresh()
    assert sum("did not finish within 5 s" in r.getMessage() for r in caplog.records) == 1
    hung.set()
    monkeypatch.setattr(webtls, "_signature", real)
    now[0] += 2.0
    assert set(settled(watcher).users) == {"grafana"} and watcher.last_reload_ok is True


@pytest.mark.parametrize(
    "broken",
    ["[" * 5000, 'tls_server_config: {cert_file: "a\\0b", key_file: k}\n', "basic_auth_users: {[a]: x}\n", "fifo"],
)
def test_a_change_that_fails_in_any_way_keeps_the_last_good(tmp_path: Path, broken: str) -> None:
    """YAML nested thousands deep, a NUL byte in a path, a list as a key, the file replaced by a
    FIFO: the previous configuration stays, the reload is marked failed; a good file loads again."""
    now = [0.0]
    path = write(tmp_path, f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n")
    watcher = WebConfigWatcher(path, clock=lambda: now[0])
    os.unlink(path)
    if broken == "fifo":
        os.mkfifo(path)
    else:
        Path(path).write_text(broken)
    now[0] += 2
    assert set(settled(watcher).users) == {USER} and watcher.last_reload_ok is False
    os.unlink(path)
    Path(path).write_text(f"basic_auth_users:\n  alice: {bcrypt_hash()}\n")
    now[0] += 2
    assert set(settled(watcher).users) == {"alice"} and watcher.last_reload_ok is True


def test_a_key_file_that_becomes_a_fifo_keeps_the_context(tls: Material, tmp_path: Path) -> None:
    for name in ("server.crt", "server.key"):
        (tmp_path / name).write_bytes((tls.dir / name).read_bytes())
    now = [0.0]
    path = write(tmp_path, "tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
    watcher = WebConfigWatcher(path, clock=lambda: now[0])
    first = watcher.current.context
    os.unlink(tmp_path / "server.key")
    os.mkfifo(tmp_path / "server.key")
    now[0] += 2
    assert settled(watcher).context is first and watcher.last_reload_ok is False
    os.unlink(tmp_path / "server.key")
    (tmp_path / "server.key").write_bytes((tls.dir / "server.key").read_bytes())
    now[0] += 2
    assert settled(watcher).context is not first and watcher.last_reload_ok is True


def test_the_first_load_is_bounded_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--check-config and the start: a web config whose reading never answers is a problem naming
    the file after the deadline, not a hang."""
    from exporter.supervisor.http import webtls

    release = threading.Event()
    monkeypatch.setattr(webtls, "load_with_context", lambda path, **kw: release.wait())
    path = write(tmp_path, "")
    try:
        with pytest.raises(WebConfigError, match="did not finish within 0.2 s"):
            webtls.load_bounded(path, deadline_s=0.2)
    finally:
        release.set()
