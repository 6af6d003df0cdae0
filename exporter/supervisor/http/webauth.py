"""Request-time checks of the web config: basic auth, client certificate SANs, the rate limit.

The HTTP side (:mod:`exporter.supervisor.http.web`, :mod:`exporter.supervisor.http.listener`) calls these
for every request or connection, with the configuration in force (:mod:`exporter.supervisor.http.webconfig`):

- :class:`BasicAuth`: RFC 7617 against bcrypt hashes; results cached, one bcrypt at a time on a
  daemon thread of its own (never the event loop's executor: a shutdown does not wait for a bcrypt
  in progress), an unknown user costs the same as a wrong password.
- :class:`FailedLogins`: wrong passwords rate-limited per client, so that one client cannot keep
  the bcrypt thread busy; credentials already verified (cached) are never delayed.
- :func:`peer_problem`: a verified client certificate must carry one of ``client_allowed_sans``.
- :class:`RateLimiter`: exporter-toolkit's ``rate_limit``, a token bucket.
- :func:`hash_password`: a hash for ``basic_auth_users`` (``nvgpu-exporter hash-password``).

Standard library and ``bcrypt`` only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import hashlib
import ipaddress
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from exporter.common.fileio import Runner
from exporter.supervisor.http.webmodel import BCRYPT_HASH, BCRYPT_MAX_COST, BCRYPT_MIN_COST, TlsSettings

__all__ = ["DUMMY_HASH", "BasicAuth", "FailedLogins", "RateLimiter", "hash_password", "peer_problem"]


def peer_problem(tls: TlsSettings, peercert: Mapping[str, Any] | None) -> str | None:
    """Why a verified client certificate is not acceptable under ``client_allowed_sans``, or None.

    Args:
        tls: the TLS settings in force.
        peercert: ``SSLObject.getpeercert()`` (None when the client sent no certificate).
    """
    if not tls.client_allowed_sans or peercert is None:
        return None
    sans = [str(v) for _k, v in peercert.get("subjectAltName", ())]
    for want in tls.client_allowed_sans:
        for have in sans:
            if _same_san(want, have):
                return None
    return f"client certificate SANs {sans} match none of client_allowed_sans"


def _same_san(want: str, have: str) -> bool:
    if want == have.strip():
        return True
    try:
        return ipaddress.ip_address(want) == ipaddress.ip_address(have.strip())
    except ValueError:
        return False


# A bcrypt hash (cost 10, the usual) of a random password nobody knows: an unknown user name is
# checked against it (or against one made at the users' cost when that is not 10), so it costs as
# much as a wrong password for a known user (no user-name oracle by timing; exporter-toolkit does
# the same with a fixed cost-10 hash).
DUMMY_HASH = b"$2b$10$zUHUiAyiYk8/znYRYN/Vk.UY8oY9WNdQF7uWeqOQYC2jOADYtdyBS"


def _bcrypt_check(password: bytes, hashed: bytes) -> bool:
    import bcrypt

    try:
        return bool(bcrypt.checkpw(password, hashed))
    except ValueError:  # bcrypt >= 5 refuses passwords over 72 bytes; so does Go's bcrypt
        return False


class BasicAuth:
    """HTTP basic auth against bcrypt hashes (RFC 7617).

    bcrypt is slow on purpose (~50-100 ms at cost 10), so each (user, hash, password) result is
    cached (a bounded LRU keyed by a SHA-256 of the three, never the password itself), and the
    bcrypt calls run one at a time on a daemon thread of their own (:class:`exporter.common.fileio.Runner`):
    the event loop keeps serving, a flood of wrong passwords costs one core at most, and a
    SIGTERM is not held up by a bcrypt in progress (``asyncio``'s default executor would be
    joined at the end of ``asyncio.run``).

    Args:
        checkpw: ``(password, hash) -> bool`` (tests count calls).
        cache_size: results kept.
    """

    def __init__(self, checkpw: Callable[[bytes, bytes], bool] = _bcrypt_check, cache_size: int = 1024) -> None:
        self.checkpw = checkpw
        self.cache_size = cache_size
        self._cache: collections.OrderedDict[bytes, bool] = collections.OrderedDict()
        self._dummies: dict[int, bytes] = {}
        self._checking: dict[bytes, asyncio.Future[bool]] = {}  # key -> the bcrypt in progress
        self.bcrypt = Runner("nvgpu-bcrypt", deadline_s=None)

    @staticmethod
    def parse(header: str | None) -> tuple[str, bytes] | None:
        """``Authorization: Basic …`` -> (user, password); None when absent or malformed."""
        if not header:
            return None
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "basic" or not token.strip():
            return None
        try:
            decoded = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = decoded.partition(b":")
        if not sep:
            return None
        return user.decode("utf-8", "replace"), password

    @staticmethod
    def _key(users: Mapping[str, bytes], user: str, password: bytes) -> bytes:
        return hashlib.sha256(b"\0".join((user.encode(), users.get(user) or b"?", password))).digest()

    def cached(self, users: Mapping[str, bytes], header: str | None) -> bool | None:
        """What is known of these credentials without a bcrypt: True (verified before), False
        (missing, malformed, or refused before), None (a bcrypt would have to run)."""
        creds = self.parse(header)
        if creds is None:
            return False
        user, password = creds
        ok = self._cache.get(self._key(users, user, password))
        if ok is None:
            return None
        return ok and user in users

    async def check(self, users: Mapping[str, bytes], header: str | None) -> str | None:
        """The authenticated user name, or None (missing, malformed or wrong credentials)."""
        creds = self.parse(header)
        if creds is None:
            return None
        user, password = creds
        hashed = users.get(user)
        known = hashed is not None
        key = self._key(users, user, password)
        ok = self._cache.get(key)
        if ok is not None:
            self._cache.move_to_end(key)
        elif key in self._checking:  # the same credentials are being checked: one bcrypt for all
            ok = await asyncio.shield(self._checking[key])
        else:
            pending: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._checking[key] = pending
            try:
                against = hashed if hashed is not None else await self._dummy(users)
                ok = await self.bcrypt.acall(self.checkpw, password, against)
            except asyncio.CancelledError:
                pending.cancel()
                raise
            except Exception as exc:
                pending.set_exception(exc)
                pending.exception()  # retrieved: nobody else may be waiting
                raise
            finally:
                del self._checking[key]
            pending.set_result(ok)
            self._cache[key] = ok
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return user if ok and known else None

    async def _dummy(self, users: Mapping[str, bytes]) -> bytes:
        """A hash of nobody's password at the cost of the configured users' hashes (the highest)."""
        costs = [int(m.group(1)) for h in users.values() if (m := BCRYPT_HASH.fullmatch(h.decode()))]
        cost = min(max(costs, default=10), BCRYPT_MAX_COST)
        if cost == 10:
            return DUMMY_HASH
        if cost not in self._dummies:
            self._dummies[cost] = await self.bcrypt.acall(_hash_random, cost)
        return self._dummies[cost]


class FailedLogins:
    """Wrong passwords rate-limited per client (by address): a token bucket of ``burst`` failed
    bcrypt checks per client, one more every ``refill_s``.

    Only checks that ran a bcrypt and failed take a token: a missing or malformed header, or a
    wrong password already refused (cached), costs nothing and takes nothing, and credentials
    already verified are let through whatever the bucket holds, so Prometheus behind the same
    address as a guesser is never delayed. A client whose bucket is empty gets 429 with
    ``Retry-After`` instead of a bcrypt. At most ``clients`` addresses are remembered (the least
    recently seen are forgotten).

    Args:
        burst: failed checks a client may make at once.
        refill_s: seconds for one more.
        clients: addresses remembered.
        clock: monotonic clock.
    """

    def __init__(
        self, burst: int = 5, refill_s: float = 2.0, clients: int = 4096, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.refill_s = refill_s
        self.clients = clients
        self.clock = clock
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def _tokens(self, client: str, now: float) -> float:
        tokens, stamp = self._buckets.get(client, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - stamp) / self.refill_s)

    def retry_after(self, client: str) -> float:
        """Seconds until ``client`` may have a password checked again; 0 when it may now."""
        if client not in self._buckets:
            return 0.0
        tokens = self._tokens(client, self.clock())
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) * self.refill_s

    def failed(self, client: str) -> None:
        """A bcrypt check for ``client`` failed: take a token."""
        now = self.clock()
        self._buckets[client] = (max(0.0, self._tokens(client, now) - 1.0), now)
        self._buckets.move_to_end(client)
        while len(self._buckets) > self.clients:
            self._buckets.popitem(last=False)


def _hash_random(cost: int) -> bytes:
    import bcrypt

    return bytes(bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(cost)))


def hash_password(password: str, cost: int = 10) -> str:
    """A bcrypt hash for ``basic_auth_users`` (``nvgpu-exporter hash-password``).

    Raises:
        ValueError: an empty password, one over 72 bytes, or a cost outside the range the web
            config accepts (:data:`exporter.supervisor.http.webmodel.BCRYPT_MAX_COST`).
    """
    import bcrypt

    if not BCRYPT_MIN_COST <= cost <= BCRYPT_MAX_COST:
        raise ValueError(f"cost {cost}: the web config accepts {BCRYPT_MIN_COST} to {BCRYPT_MAX_COST}")
    if not password:
        raise ValueError("an empty password")
    if len(password.encode()) > 72:
        raise ValueError("bcrypt takes at most 72 bytes of password")
    return str(bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode())


class RateLimiter:
    """exporter-toolkit's ``rate_limit``: a token bucket of ``burst`` refilled every ``interval_s``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._tokens = 0.0
        self._stamp = clock()
        self._shape = (0.0, 0)

    def allow(self, interval_s: float, burst: int) -> bool:
        """Take one token; False when the bucket is empty (answer 429)."""
        if interval_s <= 0:
            return True
        now = self.clock()
        if self._shape != (interval_s, burst):
            self._shape, self._tokens, self._stamp = (interval_s, burst), float(burst), now
        self._tokens = min(float(burst), self._tokens + (now - self._stamp) / interval_s)
        self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
