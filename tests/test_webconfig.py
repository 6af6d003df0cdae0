"""exporter.webconfig: the exporter-toolkit web config file, parsed strictly; basic auth; reloads."""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
from pathlib import Path

import pytest
from tls_material import PASSWORD, USER, Material, bcrypt_hash, make_material

from exporter import webconfig
from exporter.config import Config, ConfigError
from exporter.webconfig import BasicAuth, RateLimiter, WebConfigError, WebConfigWatcher, load, peer_problem


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
    cfg = load(write(tmp_path, full_config(tls)))
    assert cfg.tls is not None and cfg.context is not None
    assert cfg.tls.requires_client_cert and cfg.tls.client_allowed_sans == ("prometheus.monitoring.svc",)
    assert cfg.tls.min_version is ssl.TLSVersion.TLSv1_2 and cfg.tls.ciphers == "ECDHE-ECDSA-AES128-GCM-SHA256"
    assert cfg.tls.curve == "prime256v1"
    assert cfg.context.verify_mode is ssl.CERT_OPTIONAL  # refused in HTTP so probes can pass
    assert load(cfg.path, require_client_cert=True).context.verify_mode is ssl.CERT_REQUIRED  # type: ignore[union-attr]
    assert set(cfg.users) == {USER} and cfg.headers["X-Content-Type-Options"] == "nosniff"
    assert cfg.rate_interval_s == pytest.approx(0.1) and cfg.rate_burst == 20
    assert cfg.files() == (cfg.path, tls.path("server.crt"), tls.path("server.key"), tls.path("ca.crt"))
    assert "TLS" in cfg.describe() and "basic auth for 1 user(s)" in cfg.describe()


def test_relative_paths_are_relative_to_the_file(tls: Material) -> None:
    path = write(tls.dir, "tls_server_config: {cert_file: server.crt, key_file: server.key}\n", "relative.yml")
    cfg = load(path)
    assert cfg.tls is not None and cfg.tls.cert_file == tls.path("server.crt")


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
    cfg = load(write(tmp_path, text))
    assert cfg.context is not None and cfg.context.verify_mode is ssl.CERT_OPTIONAL
    assert not any(p.name.startswith("nvgpu-tls-") for p in Path(os.environ.get("TMPDIR", "/tmp")).iterdir())


def test_empty_file_is_plain_http_without_auth(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, ""))
    assert cfg.tls is None and cfg.context is None and not cfg.users
    assert cfg.describe() == "plain HTTP, no basic auth"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "tls_server_config:\n  cert_file: a\n  key_fil: b\n",
            "unknown key tls_server_config.'key_fil'; did you mean key_file?",
        ),
        ("basic_auth_user: {}\n", "unknown key 'basic_auth_user'; did you mean basic_auth_users?"),
        ("http_server_config: {http3: true}\n", "unknown key http_server_config.'http3'"),
        ("rate_limit: {intervall: 1s}\n", "unknown key rate_limit.'intervall'"),
        ("basic_auth_users: {a: x}\nbasic_auth_users: {b: y}\n", "duplicate key 'basic_auth_users'"),
        ("- a\n- b\n", "expected a mapping"),
        ("tls_server_config: [1]\n", "tls_server_config must be a mapping"),
        ("tls_server_config: {key_file: k}\n", "cert_file (or cert) is missing"),
        ("tls_server_config: {cert_file: c}\n", "key_file (or key) is missing"),
        ("tls_server_config: {cert_file: c, cert: x, key_file: k}\n", "give tls_server_config.cert or"),
        ("tls_server_config: {cert_file: c, key_file: k, min_version: TLS14}\n", "min_version 'TLS14' is not one of"),
        ("tls_server_config: {cert_file: c, key_file: k, min_version: TLS13, max_version: TLS12}\n", "above max"),
        ("tls_server_config: {cert_file: c, key_file: k, client_auth_type: Sometimes}\n", "is not one of NoClientCert"),
        ("tls_server_config: {cert_file: c, key_file: k, client_auth_type: RequireAnyClientCert}\n", "insecure"),
        ("tls_server_config: {cert_file: c, key_file: k, client_auth_type: RequestClientCert}\n", "not supported"),
        ("tls_server_config: {cert_file: c, key_file: k, client_ca_file: ca}\n", "client_auth_type is NoClientCert"),
        (
            "tls_server_config: {cert_file: c, key_file: k, client_auth_type: RequireAndVerifyClientCert}\n",
            "needs client_ca_file",
        ),
        (
            "tls_server_config: {cert_file: c, key_file: k, client_auth_type: VerifyClientCertIfGiven, "
            "client_ca_file: ca, client_allowed_sans: [x]}\n",
            "client_allowed_sans needs client_auth_type RequireAndVerifyClientCert",
        ),
        ("tls_server_config: {cert_file: c, key_file: k, cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]}\n", "insecure"),
        ("tls_server_config: {cert_file: c, key_file: k, curve_preferences: [CurveP999]}\n", "unknown curve"),
        ("tls_server_config: {cert_file: c, key_file: k, curve_preferences: [CurveP256, X25519]}\n", "one curve"),
        ("tls_server_config: {cert_file: c, key_file: k, prefer_server_cipher_suites: 1}\n", "true or false"),
        ("tls_server_config: {cert_file: 7, key_file: k}\n", "cert_file must be a string"),
        ("http_server_config: {headers: {Server: x}}\n", "'Server' cannot be set"),
        ("http_server_config: {headers: {X-Frame-Options: allow}}\n", "is not one of deny, sameorigin"),
        ("http_server_config: {http2: maybe}\n", "true or false"),
        ("basic_auth_users: {alice: plaintext}\n", "not a bcrypt hash"),
        ("basic_auth_users: {alice: '$2y$99$" + "a" * 53 + "'}\n", "cost 99"),
        ("basic_auth_users: {'al:ice': '$2y$10$" + "a" * 53 + "'}\n", "without ':'"),
        ("basic_auth_users: [alice]\n", "mapping of user name"),
        ("rate_limit: {interval: fast, burst: 1}\n", "duration such as 100ms"),
        ("rate_limit: {interval: 1s, burst: -1}\n", "non-negative integer"),
        ("rate_limit: {interval: 1s}\n", "every request would be refused"),
        ("tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n", "does not exist"),
        ("a: [\n", "not valid YAML"),
        ("tls_server_config: {cert_file: c, key_file: k, client_auth_type: Yes}\n", "must be a string, got True"),
    ],
)
def test_bad_files_are_clear_errors(tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(WebConfigError) as info:
        load(path)
    assert says in str(info.value) and str(info.value).startswith(f"{path}: "), str(info.value)


def test_mismatched_key_and_certificate(tls: Material, tmp_path: Path) -> None:
    text = f"tls_server_config: {{cert_file: {tls.path('server.crt')}, key_file: {tls.path('client.key')}}}\n"
    with pytest.raises(WebConfigError, match="cannot load cert_file"):
        load(write(tmp_path, text))


def test_unreadable_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match="cannot read"):
        load(str(tmp_path / "absent.yml"))
    (tmp_path / "binary.yml").write_bytes(b"\xff\xfe")
    with pytest.raises(WebConfigError, match="not UTF-8"):
        load(str(tmp_path / "binary.yml"))


def test_check_config_reports_the_web_config_file(tmp_path: Path) -> None:
    path = write(tmp_path, "tls_server_config: {cert_file: x.crt, key_fil: x.key}\n")
    with pytest.raises(ConfigError) as info:
        Config.from_env({"NVGPU_WEB_CONFIG_FILE": path})
    (problem,) = info.value.problems
    assert problem.startswith(f"NVGPU_WEB_CONFIG_FILE={path!r}:") and "did you mean key_file?" in problem


def test_go_durations() -> None:
    parse = lambda v: webconfig.parse_go_duration("f", "k", v)  # noqa: E731
    assert parse("1m30s") == 90 and parse("250ms") == 0.25 and parse("0") == 0 and parse(0) == 0
    assert parse("1.5h") == 5400 and parse("10us") == pytest.approx(1e-5)
    for bad in ("1", "s", "1x", "", "-1s", 5, None):
        with pytest.raises(WebConfigError):
            parse(bad)


# -- reloads ---------------------------------------------------------------------------------------


def test_watcher_reloads_on_change_and_keeps_the_last_good(tls: Material, tmp_path: Path) -> None:
    now = [0.0]
    path = write(tmp_path, f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n")
    watcher = WebConfigWatcher(path, clock=lambda: now[0])
    assert set(watcher.current.users) == {USER} and watcher.last_reload_ok
    # a new user: picked up at the next check
    Path(path).write_text(f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n  grafana: {bcrypt_hash()}\n")
    assert set(watcher.refresh().users) == {USER}, "checked at most once a second"
    now[0] += 1.5
    assert set(watcher.refresh().users) == {USER, "grafana"} and watcher.reloads == 1
    # a broken edit: the previous configuration stays, reload marked failed
    Path(path).write_text("basic_auth_users: {grafana: plaintext}\n")
    now[0] += 1.5
    assert set(watcher.refresh().users) == {USER, "grafana"}
    assert watcher.last_reload_ok is False
    # fixed again
    Path(path).write_text(f"basic_auth_users:\n  alice: {bcrypt_hash()}\n")
    now[0] += 1.5
    assert set(watcher.refresh().users) == {"alice"} and watcher.last_reload_ok is True


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
    assert watcher.refresh().context is not first and watcher.reloads == 1
    # a half-written rotation (new certificate, old key) keeps the last good context
    (tmp_path / "server.crt").write_bytes((tls.dir / "server.crt").read_bytes())
    now[0] += 2
    assert watcher.refresh().context is watcher.current.context and watcher.last_reload_ok is False


# -- basic auth ------------------------------------------------------------------------------------


def _header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class CountingCheck:
    """bcrypt, counting calls and the hashes it was given."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        self.calls.append(hashed)
        return webconfig._bcrypt_check(password, hashed)


def test_basic_auth_accepts_refuses_and_caches() -> None:
    users = {USER: bcrypt_hash().encode()}
    check = CountingCheck()
    auth = BasicAuth(check)

    async def run() -> None:
        assert await auth.check(users, _header(USER, PASSWORD)) == USER
        assert await auth.check(users, _header(USER, PASSWORD)) == USER
        assert len(check.calls) == 1, "a verified password is cached"
        assert await auth.check(users, _header(USER, "wrong")) is None
        assert await auth.check(users, None) is None
        assert await auth.check(users, "Bearer abc") is None
        assert await auth.check(users, "Basic !!!notbase64") is None
        assert await auth.check(users, "Basic " + base64.b64encode(b"no-colon").decode()) is None
        assert await auth.check(users, _header(USER, "x" * 100)) is None  # over bcrypt's 72 bytes

    asyncio.run(run())


@pytest.mark.parametrize("cost", [10, 5])
def test_unknown_user_costs_a_bcrypt_like_a_wrong_password(cost: int) -> None:
    """No user-name oracle: an unknown user is checked against a dummy hash of the users' cost."""
    users = {USER: bcrypt_hash(cost=cost).encode()}
    check = CountingCheck()
    auth = BasicAuth(check)

    async def run() -> None:
        assert await auth.check(users, _header("mallory", PASSWORD)) is None
        assert await auth.check(users, _header(USER, "wrong")) is None

    asyncio.run(run())
    dummy, real = check.calls
    assert real == users[USER]
    assert dummy != real and dummy[4:7] == f"{cost:02d}$".encode(), dummy
    if cost == 10:
        assert dummy == webconfig.DUMMY_HASH
    assert webconfig.BCRYPT_HASH.fullmatch(dummy.decode())


def test_hash_password_makes_a_hash_the_loader_and_bcrypt_accept(tmp_path: Path) -> None:
    hashed = webconfig.hash_password("correct horse", cost=4)
    cfg = load(write(tmp_path, f"basic_auth_users:\n  alice: {hashed}\n"))
    assert webconfig._bcrypt_check(b"correct horse", cfg.users["alice"])
    for bad in ("", "x" * 73):
        with pytest.raises(ValueError):
            webconfig.hash_password(bad)


def test_the_cache_is_bounded_and_never_holds_a_password() -> None:
    users = {USER: bcrypt_hash().encode()}
    auth = BasicAuth(cache_size=4)

    async def run() -> None:
        for i in range(10):
            await auth.check(users, _header(USER, f"guess-{i}"))

    asyncio.run(run())
    assert len(auth._cache) == 4
    assert all(len(k) == 32 and b"guess" not in k for k in auth._cache)


def test_client_allowed_sans(tls: Material, tmp_path: Path) -> None:
    cfg = load(write(tmp_path, full_config(tls)))
    assert cfg.tls is not None
    assert peer_problem(cfg.tls, {"subjectAltName": (("DNS", "prometheus.monitoring.svc"),)}) is None
    assert peer_problem(cfg.tls, {"subjectAltName": (("DNS", "other.example"),)}) is not None
    assert peer_problem(cfg.tls, {}) is not None
    assert peer_problem(cfg.tls, None) is None  # no certificate: the HTTP layer refuses it (probes may pass)
    v6 = webconfig.TlsSettings(client_allowed_sans=("2001:db8::1",))
    assert peer_problem(v6, {"subjectAltName": (("IP Address", "2001:DB8:0:0:0:0:0:1\n"),)}) is None


def test_rate_limiter_is_a_token_bucket() -> None:
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert [limiter.allow(1.0, 3) for _ in range(4)] == [True, True, True, False]
    now[0] += 1.0
    assert limiter.allow(1.0, 3) and not limiter.allow(1.0, 3)
    assert all(limiter.allow(0.0, 0) for _ in range(100)), "interval 0 disables it"
