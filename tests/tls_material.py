"""Test certificates made with the openssl command line: a CA, a server certificate for
127.0.0.1/localhost, client certificates (one allowed SAN, one other SAN, one from a foreign CA),
and bcrypt hashes. Nothing here is secret; everything lives in the test's tmp_path."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

PASSWORD = "s3cret-scrape"
USER = "prometheus"


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def _ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def _leaf(directory: Path, ca: str, name: str, san: str, usage: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=directory,
    )  # fmt: skip
    (directory / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=directory,
    )  # fmt: skip


@dataclass
class Material:
    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def client_context(self, cert: str | None = "client", ca: str = "ca") -> ssl.SSLContext:
        """A client context trusting ``ca`` and presenting ``cert`` (None: no certificate)."""
        ctx = ssl.create_default_context(cafile=self.path(f"{ca}.crt"))
        if cert is not None:
            ctx.load_cert_chain(self.path(f"{cert}.crt"), self.path(f"{cert}.key"))
        return ctx


def make_material(directory: Path) -> Material:
    """CA ``ca``; ``server`` (127.0.0.1, localhost); clients ``client`` (DNS prometheus.monitoring.svc),
    ``stranger`` (same CA, DNS other.example) and ``foreign`` (signed by another CA ``evil``)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _ca(directory, "evil")
    _leaf(directory, "ca", "server", "IP:127.0.0.1,DNS:localhost", "serverAuth")
    _leaf(directory, "ca", "client", "DNS:prometheus.monitoring.svc", "clientAuth")
    _leaf(directory, "ca", "stranger", "DNS:other.example", "clientAuth")
    _leaf(directory, "evil", "foreign", "DNS:prometheus.monitoring.svc", "clientAuth")
    return Material(directory)


def bcrypt_hash(password: str = PASSWORD, cost: int = 4) -> str:
    """A bcrypt hash as htpasswd writes it (``$2y$``); cost 4 keeps tests fast."""
    bcrypt = pytest.importorskip("bcrypt")
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode().replace("$2b$", "$2y$", 1)
