"""TLS, client certificates and basic auth from the web config file, with real
TLS clients against the real exporter process (supervisor + worker on the fake backend).

One exporter serves HTTPS with ``client_auth_type: RequireAndVerifyClientCert``,
``client_allowed_sans`` and a bcrypt user; the probes stay reachable without credentials (the
kubelet has none). A second one sets ``NVGPU_WEB_PROBES_WITHOUT_AUTH=false``: then the handshake
itself refuses a client without a certificate, as exporter-toolkit does. The certificate is
rotated on disk and the next connection sees the new one without a restart.
"""

from __future__ import annotations

import base64
import http.client
import shutil
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from exporter_proc import Exporter
from tls_material import PASSWORD, USER, Material, _leaf, bcrypt_hash, make_material


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Material:
    material = make_material(tmp_path_factory.mktemp("tls"))
    _leaf(material.dir, "ca", "server2", "IP:127.0.0.1,DNS:localhost", "serverAuth")  # for the rotation
    return material


def web_config(tls: Material, directory: Path) -> Path:
    """A web config with its own copy of the server certificate (so a test can rotate it)."""
    for name in ("server.crt", "server.key"):
        shutil.copy(tls.dir / name, directory / name)
    path = directory / "web-config.yml"
    path.write_text(
        "tls_server_config:\n"
        "  cert_file: server.crt\n"
        "  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {tls.path('ca.crt')}\n"
        "  client_allowed_sans: [prometheus.monitoring.svc]\n"
        "http_server_config:\n"
        "  headers: {X-Content-Type-Options: nosniff}\n"
        "basic_auth_users:\n"
        f"  {USER}: {bcrypt_hash()}\n"
    )
    return path


@pytest.fixture(scope="module")
def secured(tls: Material, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    tmp = tmp_path_factory.mktemp("secured")
    env = {"NVGPU_WEB_CONFIG_FILE": str(web_config(tls, tmp))}
    with Exporter(None, tmp, env=env, args=["--nvml-backend", "fake:h200x1"]) as exp:
        yield exp


def auth(user: str = USER, password: str = PASSWORD) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def request(
    exp: Exporter, path: str, context: ssl.SSLContext, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", exp.port, context=context, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_probes_answer_without_credentials_over_https(secured: Exporter, tls: Material) -> None:
    """The kubelet probes with `scheme: HTTPS` and no certificate or password (docs/kubernetes.md)."""
    anonymous = tls.client_context(cert=None)
    assert request(secured, "/healthz", anonymous)[0] == 200
    status, _, body = request(secured, "/readyz", anonymous)
    assert status in (200, 503) and body  # ready or not: an answer, not a refusal


def test_metrics_need_a_client_certificate(secured: Exporter, tls: Material) -> None:
    status, _, body = request(secured, "/metrics", tls.client_context(cert=None), auth())
    assert status == 403 and b"client certificate" in body
    assert request(secured, "/", tls.client_context(cert=None), auth())[0] == 403


def test_wrong_or_missing_password_is_401(secured: Exporter, tls: Material) -> None:
    ctx = tls.client_context()
    status, headers, _ = request(secured, "/metrics", ctx)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic realm=")
    assert request(secured, "/metrics", ctx, auth(password="wrong"))[0] == 401
    assert request(secured, "/metrics", ctx, auth(user="nobody"))[0] == 401
    assert request(secured, "/metrics", ctx, {"Authorization": "Basic %%%"})[0] == 401


def test_certificate_and_password_get_the_metrics(secured: Exporter, tls: Material) -> None:
    status, headers, body = request(secured, "/metrics", tls.client_context(), auth())
    assert status == 200 and b"nvgpu_up" in body
    assert headers["Server"] == "nvgpu-exporter"
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_a_certificate_from_another_ca_fails_the_handshake(secured: Exporter, tls: Material) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        request(secured, "/healthz", tls.client_context(cert="foreign"))


def test_a_san_not_allowed_closes_the_connection(secured: Exporter, tls: Material) -> None:
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError, ssl.SSLError, OSError)):
        request(secured, "/metrics", tls.client_context(cert="stranger"), auth())


def test_plain_http_to_the_tls_port_is_told_to_use_https(secured: Exporter) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", secured.port, timeout=10)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    assert resp.status == 400 and b"use https://" in resp.read()
    assert resp.getheader("Server") == "nvgpu-exporter"
    conn.close()


def test_garbage_on_the_tls_port_is_closed(secured: Exporter) -> None:
    with socket.create_connection(("127.0.0.1", secured.port), timeout=10) as s:
        s.sendall(b"\x00\x01\x02\x03")
        s.settimeout(10)
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass  # closed with unread bytes: a reset, closed all the same


def test_refusals_are_counted(secured: Exporter, tls: Material) -> None:
    request(secured, "/metrics", tls.client_context(cert=None))  # one more 403
    denied = (
        'nvgpu_http_requests_denied_total{reason="client_certificate"}',
        'nvgpu_http_requests_denied_total{reason="unauthorized"}',
    )

    def counted() -> str | None:  # in the next rendering (one per snapshot, or when older than 5 s)
        status, _, body = request(secured, "/metrics", tls.client_context(), auth())
        assert status == 200
        return body.decode() if all(d in body.decode() for d in denied) else None

    text = secured.wait_until(counted, 10, "both refusals counted in /metrics")
    assert "nvgpu_web_config_last_reload_successful 1.0" in text
    assert "process_resident_memory_bytes " in text and 'process_resident_memory_bytes{process="worker"}' in text


def _peer_certificate(exp: Exporter, tls: Material) -> bytes:
    with socket.create_connection(("127.0.0.1", exp.port), timeout=10) as raw:
        with tls.client_context(cert=None).wrap_socket(raw, server_hostname="127.0.0.1") as s:
            der = s.getpeercert(binary_form=True)
            assert der
            return der


def test_certificate_rotation_without_restart(tls: Material, tmp_path: Path) -> None:
    env = {"NVGPU_WEB_CONFIG_FILE": str(web_config(tls, tmp_path))}
    with Exporter(None, tmp_path, env=env, args=["--nvml-backend", "fake:h200x1"]) as exp:
        before = _peer_certificate(exp, tls)
        assert before == ssl.PEM_cert_to_DER_cert((tls.dir / "server.crt").read_text())
        # what cert-manager or a Secret update does: new files under the same names
        shutil.copy(tls.dir / "server2.key", tmp_path / "server.key.new")
        shutil.copy(tls.dir / "server2.crt", tmp_path / "server.crt.new")
        (tmp_path / "server.key.new").replace(tmp_path / "server.key")
        (tmp_path / "server.crt.new").replace(tmp_path / "server.crt")
        after = exp.wait_until(
            lambda: (der := _peer_certificate(exp, tls)) != before and der, 15, "the new certificate served"
        )
        assert after == ssl.PEM_cert_to_DER_cert((tls.dir / "server2.crt").read_text())
        assert exp.proc.poll() is None
        assert any("web config" in r.get("msg", "") and "reloaded" in r.get("msg", "") for r in exp.log_records())
        assert exp.terminate() == 0


def test_probes_can_be_made_to_need_a_certificate(tls: Material, tmp_path: Path) -> None:
    """NVGPU_WEB_PROBES_WITHOUT_AUTH=false: exporter-toolkit's behaviour, the handshake refuses."""
    env = {"NVGPU_WEB_CONFIG_FILE": str(web_config(tls, tmp_path)), "NVGPU_WEB_PROBES_WITHOUT_AUTH": "false"}
    with Exporter(None, tmp_path, env=env, args=["--nvml-backend", "fake:h200x1"]) as exp:
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected, OSError)):
            request(exp, "/healthz", tls.client_context(cert=None))
        assert request(exp, "/healthz", tls.client_context())[0] == 401, "and the password"
        assert request(exp, "/healthz", tls.client_context(), auth())[0] == 200
        assert exp.terminate() == 0


def test_a_bad_web_config_stops_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config: {cert_file: /nope.crt, key_file: /nope.key}\n")
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    env["NVGPU_WEB_CONFIG_FILE"] = str(path)
    proc = subprocess.run([sys.executable, "-m", "exporter"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "NVGPU_WEB_CONFIG_FILE=" in proc.stderr and "/nope.crt does not exist" in proc.stderr
