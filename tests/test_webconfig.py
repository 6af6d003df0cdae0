"""exporter.supervisor.http.webconfig: the exporter-toolkit web config file, parsed strictly, every problem at once;
and the conformance corpus in tests/fixtures/webconfig (good/ loads, bad/ names its problems)."""

from __future__ import annotations

import os
import re
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from tls_material import Material, make_material

from exporter.config import Config
from exporter.settingvalues import ConfigError
from exporter.supervisor.http import webconfig
from exporter.supervisor.http.webauth import RateLimiter
from exporter.supervisor.http.webconfig import load
from exporter.supervisor.http.webmodel import WebConfigError
from exporter.supervisor.http.webtls import load_with_context

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).parent / "fixtures" / "webconfig"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Material:
    return make_material(tmp_path_factory.mktemp("tls"))


def write(directory: Path, text: str, name: str = "web.yml") -> str:
    path = directory / name
    path.write_text(text)
    return str(path)


def test_relative_paths_are_relative_to_the_file(tls: Material) -> None:
    path = write(tls.dir, "tls_server_config: {cert_file: server.crt, key_file: server.key}\n", "relative.yml")
    cfg = load(path)
    assert cfg.tls is not None and cfg.tls.cert_file == tls.path("server.crt")


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


def test_unreadable_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match="cannot read"):
        load(str(tmp_path / "absent.yml"))
    (tmp_path / "binary.yml").write_bytes(b"\xff\xfe")
    with pytest.raises(WebConfigError, match="not UTF-8"):
        load(str(tmp_path / "binary.yml"))


def test_check_config_reports_the_web_config_file(tmp_path: Path) -> None:
    path = write(tmp_path, "tls_server_config: {cert_file: x.crt, key_fil: x.key}\n")
    with pytest.raises(ConfigError) as info:
        Config.from_env({"NVGPU_WEB_CONFIG_FILE": path, "NVGPU_LOG_FORMAT": "jsn"})
    problems = info.value.problems
    web = [p for p in problems if p.startswith(f"NVGPU_WEB_CONFIG_FILE={path!r}: {path}: ")]
    assert len(web) == 3 and len(problems) == 4, problems  # the other one: NVGPU_LOG_FORMAT
    assert "did you mean key_file?" in web[0] and "key_file (or key) is missing" in web[1]
    assert "x.crt does not exist" in web[2]


def test_what_the_toolkit_accepts_is_accepted_as_it_does_it_with_a_caution(tls: Material) -> None:
    """The three cases where exporter-toolkit loads a file and then does something surprising."""
    text = (
        "tls_server_config: {cert_file: server.crt, key_file: server.key,\n"
        "                    client_auth_type: RequireAndVerifyClientCert}\n"
        "rate_limit: {interval: 1s}\n"
    )
    path = write(tls.dir, text, "toolkit.yml")
    cfg = load_with_context(path)
    assert cfg.tls is not None and cfg.tls.verifies_against_system_roots and cfg.context is not None
    assert cfg.context.verify_mode == ssl.CERT_OPTIONAL
    assert (cfg.rate_interval_s, cfg.rate_burst) == (1.0, 0)
    assert len(cfg.cautions) == 2, cfg.cautions
    assert "against this system's CA roots" in cfg.cautions[0] and "every request is answered 429" in cfg.cautions[1]
    assert "client certificates RequireAndVerifyClientCert against the system roots" in cfg.describe()
    headers = load(write(tls.dir, "http_server_config: {headers: {X-XSS-Protection: 1, Content-Security-Policy: "
                         "yes, Strict-Transport-Security: 1.50}}\n", "numbers.yml")).headers  # fmt: skip
    assert headers == {"X-XSS-Protection": "1", "Content-Security-Policy": "yes", "Strict-Transport-Security": "1.50"}
    assert load(write(tls.dir, "http_server_config: {headers: {X-Frame-Options: deny}}\n", "plain.yml")).cautions == ()


def test_a_limiter_with_burst_zero_refuses_every_request() -> None:
    limiter = RateLimiter(clock=lambda: 0.0)
    assert not any(limiter.allow(1.0, 0) for _ in range(3))


def test_go_durations() -> None:
    parse = lambda v: webconfig.parse_go_duration("f", "k", v)  # noqa: E731
    assert parse("1m30s") == 90 and parse("250ms") == 0.25 and parse("0") == 0 and parse(0) == 0
    assert parse("1.5h") == 5400 and parse("10us") == pytest.approx(1e-5)
    for bad in ("1", "s", "1x", "", "-1s", 5, None):
        with pytest.raises(WebConfigError):
            parse(bad)


# -- every problem at once -------------------------------------------------------------------------

FIVE_PROBLEMS = """
tls_server_config:
  cert_file: missing.crt
  key_file: missing.key
  min_version: TLS99
http_server_config:
  headrs: {X-Frame-Options: deny}
basic_auth_users:
  prometheus: hunter2
"""


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, FIVE_PROBLEMS)
    with pytest.raises(WebConfigError) as info:
        load(path)
    problems = info.value.problems
    assert [p.split(": ", 1)[0] for p in problems] == [path] * 5, problems
    for says in (
        f"cert_file {tmp_path / 'missing.crt'} does not exist",
        f"key_file {tmp_path / 'missing.key'} does not exist",
        "min_version 'TLS99' is not one of",
        "unknown key http_server_config.'headrs'; did you mean headers?",
        "basic_auth_users.prometheus is not a bcrypt hash",
    ):
        assert sum(says in p for p in problems) == 1, (says, problems)
    assert str(info.value) == "; ".join(problems)


def test_check_config_prints_every_web_config_problem_and_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, FIVE_PROBLEMS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--check-config", "--web.config.file", path],
        env=env, capture_output=True, text=True, timeout=60, cwd=str(ROOT),
    )  # fmt: skip
    assert proc.returncode == 2, proc
    lines = proc.stderr.splitlines()
    assert lines[0] == "nvgpu-exporter: 5 configuration problem(s):", proc.stderr
    assert all(line.startswith(f"  - --web.config.file={path!r}: {path}: ") for line in lines[1:]), proc.stderr
    assert len(lines) == 6 and "did you mean headers?" in proc.stderr and "TLS99" in proc.stderr


def test_a_file_that_is_not_a_mapping_is_one_problem(tmp_path: Path) -> None:
    for text in ("- a\n- b\n", "a: [\n", "? [a, b]\n: 1\n"):
        with pytest.raises(WebConfigError) as info:
            load(write(tmp_path, text))
        assert len(info.value.problems) == 1, info.value.problems


# -- the conformance corpus ------------------------------------------------------------------------

# exporter-toolkit's web/testdata YAML files (prometheus/exporter-toolkit at 19a7c2d): each is a case
# the corpus covers with a file of its own, named on the file's "# toolkit:" line.
TOOLKIT_CASES = {
    "tls_config_noAuth.requireandverifyclientcert.good.yml",
    "tls_config_noAuth.requireanyclientcert.good.yml",
    "tls_config_noAuth.requireanyclientcertkeyinline.good.yml",
    "web_config_auth_clientCAs_invalid.bad.yml",
    "web_config_auth_clientCAs_missing.bad.yml",
    "web_config_auth_client_san.bad.yaml",
    "web_config_auth_client_san.good.yaml",
    "web_config_auth_user_list_invalid.bad.yml",
    "web_config_empty.yml",
    "web_config_headers.good.yml",
    "web_config_headers_content_type_options.bad.yml",
    "web_config_headers_extra_header.bad.yml",
    "web_config_headers_frame_options.bad.yml",
    "web_config_junk.yml",
    "web_config_junk_key.yml",
    "web_config_noAuth.bad.yml",
    "web_config_noAuth.good.blocking.yml",
    "web_config_noAuth.good.yml",
    "web_config_noAuth_allCiphers.good.yml",
    "web_config_noAuth_allCurves.good.yml",
    "web_config_noAuth_certPath_empty.bad.yml",
    "web_config_noAuth_certPath_invalid.bad.yml",
    "web_config_noAuth_certPath_keyPath_empty.bad.yml",
    "web_config_noAuth_certPath_keyPath_invalid.bad.yml",
    "web_config_noAuth_cert_empty.bad.yml",
    "web_config_noAuth_inventedCiphers.bad.yml",
    "web_config_noAuth_inventedCurves.bad.yml",
    "web_config_noAuth_keyPath_empty.bad.yml",
    "web_config_noAuth_keyPath_invalid.bad.yml",
    "web_config_noAuth_key_empty.bad.yml",
    "web_config_noAuth_noHTTP2.good.yml",
    "web_config_noAuth_noHTTP2Cipher.bad.yml",
    "web_config_noAuth_someCiphers.good.yml",
    "web_config_noAuth_someCiphers_noOrder.good.yml",
    "web_config_noAuth_someCurves.good.yml",
    "web_config_noAuth_tlsInline.good.yml",
    "web_config_noAuth_wrongTLSVersion.bad.yml",
    "web_config_rate_limiter_nonblocking.yaml",
    "web_config_rate_limiter_one_second.yaml",
    "web_config_users.good.yml",
    "web_config_users_noTLS.good.yml",
}
_TOOLKIT_LINE = re.compile(r"# toolkit: (?P<names>[^(]*?)\s*(?:\((?P<verdict>loads|refuses)[^)]*\))?$")


def corpus(kind: str) -> list[Path]:
    return sorted((CORPUS / kind).glob("*.yml"))


def header(path: Path, key: str) -> list[str]:
    """The values of the file's ``# <key>: ...`` comment lines."""
    prefix = f"# {key}: "
    return [line[len(prefix) :] for line in path.read_text().splitlines() if line.startswith(prefix)]


def toolkit(path: Path) -> tuple[set[str], str | None]:
    """(the toolkit cases the file stands for, the toolkit's verdict on them: loads, refuses or None)."""
    (line,) = [line for line in path.read_text().splitlines() if line.startswith("# toolkit: ")]
    match = _TOOLKIT_LINE.fullmatch(line)
    assert match is not None, f"{path.name}: malformed toolkit line {line!r}"
    names = {n.strip() for n in match["names"].split(",") if n.strip() not in ("", "-")}
    return names, match["verdict"]


def materialise(source: Path, directory: Path) -> Path:
    """The corpus file, written beside the test certificates, each ``@<file>`` line replaced by
    that file's PEM at the same indentation."""
    lines = []
    for line in source.read_text().splitlines():
        name = line.strip()
        if name.startswith("@"):
            indent = line[: len(line) - len(line.lstrip())]
            lines += [indent + pem for pem in (directory / name[1:]).read_text().splitlines()]
        else:
            lines.append(line)
    target = directory / f"{source.parent.name}-{source.name}"
    target.write_text("\n".join(lines) + "\n")
    return target


@pytest.mark.parametrize("source", corpus("good"), ids=lambda p: p.name)
def test_every_good_file_loads_with_its_tls_context(source: Path, tls: Material) -> None:
    cfg = load_with_context(str(materialise(source, tls.dir)))
    assert (cfg.context is None) == (cfg.tls is None)
    _names, verdict = toolkit(source)
    if verdict == "refuses":
        assert header(source, "why"), f"{source.name}: the toolkit refuses what we accept: say why"


@pytest.mark.parametrize("source", corpus("bad"), ids=lambda p: p.name)
def test_every_bad_file_names_each_of_its_problems(source: Path, tls: Material) -> None:
    path = materialise(source, tls.dir)
    expected = [e.replace("<dir>", str(tls.dir)) for e in header(source, "expect")]
    assert expected, f"{source.name}: a bad file lists its problems on '# expect:' lines"
    with pytest.raises(WebConfigError) as info:
        load_with_context(str(path))
    problems = info.value.problems
    assert len(problems) == len(expected), problems
    for want in expected:
        assert sum(want in p for p in problems) == 1, (want, problems)
    assert all(p.startswith(f"{path}: ") for p in problems), problems
    _names, verdict = toolkit(source)
    if verdict == "loads":
        assert header(source, "why"), f"{source.name}: the toolkit accepts what we refuse: say why"


def test_the_corpus_covers_every_case_of_the_toolkits_testdata() -> None:
    covered: set[str] = set()
    for source in corpus("good") + corpus("bad"):
        covered |= toolkit(source)[0]
    assert covered == TOOLKIT_CASES, (TOOLKIT_CASES - covered, covered - TOOLKIT_CASES)


# -- every exception of the loader is a problem; no file blocks; bounded bcrypt cost ---------------


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[" * 5000, "nested too deeply"),
        ("a: " + "{b: " * 3000, "nested too deeply"),
        ("basic_auth_users:\n  ? [a, b]\n  : x\n", "unhashable key"),
        ("? {a: 1}\n: 1\n", "unhashable key"),
        ('tls_server_config:\n  cert_file: "a\\0b"\n  key_file: k\n', "NUL byte"),
        ("tls_server_config:\n  cert_file: !!binary aGVsbG8=\n  key_file: k\n", "must be a string"),
        ("basic_auth_users: !!set {a}\n", "basic_auth_users must be a mapping"),
    ],
)
def test_any_failure_of_the_loader_is_a_problem_of_the_file(tmp_path: Path, text: str, says: str) -> None:
    """YAML nested thousands deep (a RecursionError), a list as a mapping key, a NUL byte in a path
    (a ValueError from the OS layer): each is a WebConfigError naming the file, never another
    exception."""
    path = write(tmp_path, text)
    with pytest.raises(WebConfigError) as info:
        load_with_context(path)
    assert str(tmp_path) in str(info.value) and says in str(info.value), info.value


@pytest.mark.parametrize("which", ["web.yml", "server.key", "server.crt", "ca.crt"])
def test_a_fifo_anywhere_is_refused_at_once_with_its_name(tls: Material, tmp_path: Path, which: str) -> None:
    """A FIFO where the web config, a certificate, a key or the client CA should be: a problem
    naming that path, at once (a plain open() would wait forever for a writer)."""
    for name in ("server.crt", "server.key", "ca.crt"):
        (tmp_path / name).write_bytes((tls.dir / name).read_bytes())
    text = (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
    )
    path = write(tmp_path, text)
    os.unlink(tmp_path / which)
    os.mkfifo(tmp_path / which)
    with pytest.raises(WebConfigError) as info:
        load_with_context(path)
    assert f"{tmp_path / which}" in str(info.value) and "is a FIFO, not a regular file" in str(info.value)
    assert info.value.reason == "not_regular"


def test_a_device_node_is_refused_as_a_key(tls: Material, tmp_path: Path) -> None:
    text = f"tls_server_config: {{cert_file: {tls.path('server.crt')}, key_file: /dev/zero}}\n"
    with pytest.raises(WebConfigError, match="key_file /dev/zero is a character device 1:5, not a regular file"):
        load_with_context(write(tmp_path, text))


def test_bcrypt_cost_above_the_bound_is_refused_with_the_reason(tmp_path: Path) -> None:
    """A $2b$31$ hash would hold a core for days per wrong password: refused at load, saying why
    and how to make a new one. 4 to 14 load (see webmodel.BCRYPT_MAX_COST for why 14)."""
    salt = "N9qo8uLOickgx2ZMRZoMye"
    digest = "IjZAgcfl7p92ldGxad68LJZdL17lhWy"
    for cost, ok in ((4, True), (10, True), (12, True), (14, True), (15, False), (31, False)):
        path = write(tmp_path, f"basic_auth_users:\n  alice: $2b${cost:02d}${salt}{digest}\n")
        if ok:
            assert set(load(path).users) == {"alice"}, cost
            continue
        with pytest.raises(WebConfigError) as info:
            load(path)
        (problem,) = info.value.problems
        assert f"basic_auth_users.alice: bcrypt cost {cost} is above 14" in problem, problem
        assert "hash-password --cost 12" in problem
    assert "1.7 days" in webconfig._cost_problem("a", 31)


def test_hash_password_is_bounded_the_same() -> None:
    from exporter.supervisor.http.webauth import hash_password

    with pytest.raises(ValueError, match="4 to 14"):
        hash_password("pw", cost=15)
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "hash-password", "--cost", "31"],
        input="pw\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "invalid choice: 31" in proc.stderr and "Traceback" not in proc.stderr
