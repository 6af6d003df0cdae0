"""exporter.supervisor.http.webauth: basic auth against bcrypt hashes, client certificate SANs, the rate limit."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest
from tls_material import PASSWORD, USER, bcrypt_hash

from exporter.supervisor.http import webauth
from exporter.supervisor.http.webauth import BasicAuth, FailedLogins, RateLimiter, peer_problem
from exporter.supervisor.http.webconfig import load
from exporter.supervisor.http.webmodel import BCRYPT_HASH, TlsSettings


def _header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class CountingCheck:
    """bcrypt, counting calls and the hashes it was given."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        self.calls.append(hashed)
        return webauth._bcrypt_check(password, hashed)


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
        assert dummy == webauth.DUMMY_HASH
    assert BCRYPT_HASH.fullmatch(dummy.decode())


def test_hash_password_makes_a_hash_the_loader_and_bcrypt_accept(tmp_path: Path) -> None:
    hashed = webauth.hash_password("correct horse", cost=4)
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: {hashed}\n")
    cfg = load(str(path))
    assert webauth._bcrypt_check(b"correct horse", cfg.users["alice"])
    for bad in ("", "x" * 73):
        with pytest.raises(ValueError):
            webauth.hash_password(bad)


def test_the_cache_is_bounded_and_never_holds_a_password() -> None:
    users = {USER: bcrypt_hash().encode()}
    auth = BasicAuth(cache_size=4)

    async def run() -> None:
        for i in range(10):
            await auth.check(users, _header(USER, f"guess-{i}"))

    asyncio.run(run())
    assert len(auth._cache) == 4
    assert all(len(k) == 32 and b"guess" not in k for k in auth._cache)


def test_client_allowed_sans() -> None:
    tls = TlsSettings(client_auth="RequireAndVerifyClientCert", client_allowed_sans=("prometheus.monitoring.svc",))
    assert peer_problem(tls, {"subjectAltName": (("DNS", "prometheus.monitoring.svc"),)}) is None
    assert peer_problem(tls, {"subjectAltName": (("DNS", "other.example"),)}) is not None
    assert peer_problem(tls, {}) is not None
    assert peer_problem(tls, None) is None  # no certificate: the HTTP layer refuses it (probes may pass)
    assert peer_problem(TlsSettings(), {"subjectAltName": (("DNS", "other.example"),)}) is None  # no SANs asked
    v6 = TlsSettings(client_allowed_sans=("2001:db8::1",))
    assert peer_problem(v6, {"subjectAltName": (("IP Address", "2001:DB8:0:0:0:0:0:1\n"),)}) is None


def test_rate_limiter_is_a_token_bucket() -> None:
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert [limiter.allow(1.0, 3) for _ in range(4)] == [True, True, True, False]
    now[0] += 1.0
    assert limiter.allow(1.0, 3) and not limiter.allow(1.0, 3)
    assert all(limiter.allow(0.0, 0) for _ in range(100)), "interval 0 disables it"


# -- bounded bcrypt cost, wrong passwords limited per client, never the event loop's executor ------


def test_failed_logins_are_a_token_bucket_per_client() -> None:
    now = [0.0]
    logins = FailedLogins(burst=3, refill_s=2.0, clients=2, clock=lambda: now[0])
    for _ in range(3):
        assert logins.retry_after("10.0.0.1") == 0.0
        logins.failed("10.0.0.1")
    assert logins.retry_after("10.0.0.1") == pytest.approx(2.0), "the bucket is empty: one more in 2 s"
    assert logins.retry_after("10.0.0.2") == 0.0, "another client is not limited"
    now[0] += 1.0
    assert logins.retry_after("10.0.0.1") == pytest.approx(1.0)
    now[0] += 1.0
    assert logins.retry_after("10.0.0.1") == 0.0
    logins.failed("10.0.0.2")
    logins.failed("10.0.0.3")  # a third client: the least recently seen is forgotten
    assert len(logins._buckets) == 2 and "10.0.0.1" not in logins._buckets


def test_concurrent_checks_of_the_same_credentials_run_one_bcrypt() -> None:
    """200 scrapes with the same (not yet verified) credentials after a restart: one bcrypt."""
    users = {USER: bcrypt_hash().encode()}
    check = CountingCheck()
    auth = BasicAuth(check)

    async def run() -> list[str | None]:
        return await asyncio.gather(*(auth.check(users, _header(USER, PASSWORD)) for _ in range(200)))

    assert asyncio.run(run()) == [USER] * 200 and len(check.calls) == 1
    assert auth.cached(users, _header(USER, PASSWORD)) is True
    assert auth.cached(users, _header(USER, "other")) is None and auth.cached(users, None) is False


def test_bcrypt_runs_on_a_daemon_thread_that_shutdown_does_not_wait_for() -> None:
    """asyncio.to_thread would put the check on the loop's default executor, which asyncio.run
    joins when it ends: a SIGTERM would wait for the bcrypt. The check's thread is a daemon of its
    own, and a loop that ends while it runs ends at once."""
    import threading

    release = threading.Event()
    started = threading.Event()

    def slow(password: bytes, hashed: bytes) -> bool:
        started.set()
        release.wait()
        return False

    auth = BasicAuth(slow)
    users = {USER: bcrypt_hash().encode()}

    async def main() -> None:
        task = asyncio.ensure_future(auth.check(users, _header(USER, "wrong")))
        while not started.is_set():
            await asyncio.sleep(0.01)  # until the check is on its thread
        task.cancel()

    asyncio.run(main())  # returns although the check still runs
    assert started.is_set() and not release.is_set()
    threads = [t for t in threading.enumerate() if t.name == "nvgpu-bcrypt"]
    assert threads and all(t.daemon for t in threads)
    release.set()


def test_the_dummy_hash_never_exceeds_the_cost_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Users built by hand past the loader (which refuses cost 31): the unknown-user dummy is made
    at the bound, never at cost 31 (days of a core)."""
    users = {USER: b"$2b$31$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"}
    made: list[int] = []
    real = webauth._hash_random
    monkeypatch.setattr(webauth, "_hash_random", lambda cost: (made.append(cost), real(4))[1])
    asyncio.run(BasicAuth(lambda p, h: False).check(users, _header("mallory", "x")))
    assert made == [webauth.BCRYPT_MAX_COST]
