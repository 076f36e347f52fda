"""A growing delay after failed sign-ins, per username and client address.

The first ``SIGN_IN_FREE_FAILURES`` failures cost nothing (people mistype). After that,
each failure makes the next attempt for that username from that address wait twice as
long as the one before: 1 s, 2 s, 4 s ... up to ``SIGN_IN_MAX_DELAY_SECONDS``. While a
delay runs, attempts are refused (429 with ``Retry-After``) without looking at the
password, so they teach an attacker nothing; once it ran out, the right password signs
in and clears the count. Nothing here needs an admin to undo.

It is kept per username *and* address, not per username alone: an attacker who keeps a
named admin's delay at its cap from their own address slows only themself, and the admin
signing in from their own address is not held up. Guessing from many addresses is
bounded by the per-address throttle (``sign_in``) and the password rules.

Counts live in the cache every process shares, with atomic ``add`` and ``incr``: of
concurrent attempts for one username and address, one is checked at a time and the others
are refused, so a burst at the moment a delay runs out buys one guess, not one per
thread.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

from accounts.errors import SignInDelayed

#: Failures are forgotten this long after the last one.
FORGET_SECONDS = 24 * 3600
#: The most one check of a password may take; a claim left by a crashed request ends then.
CHECK_SECONDS = 30


def delay_after(failures: int) -> int:
    """Seconds the next attempt waits after ``failures`` failures in a row."""
    free = settings.MEDSPLIT["SIGN_IN_FREE_FAILURES"]
    cap = settings.MEDSPLIT["SIGN_IN_MAX_DELAY_SECONDS"]
    if failures < free:
        return 0
    return min(2 ** min(failures - free, 40), cap)


@dataclass
class SignInAttempt:
    """One attempt for ``username`` from ``address``, allowed to check its password.

    Attributes:
        failures: failures in a row before this attempt.
    """

    username: str
    address: str | None
    failures: int
    _key: str

    def failed(self) -> int:
        """Count this attempt as failed; returns the seconds the next one must wait."""
        delay = delay_after(self.failures + 1)
        if delay:
            # Set before the count goes up: whoever sees the new count sees the delay.
            cache.set(f"{self._key}:until", time.time() + delay, timeout=FORGET_SECONDS)
        cache.add(f"{self._key}:failures", 0, timeout=FORGET_SECONDS)
        try:
            cache.incr(f"{self._key}:failures")
        except ValueError:  # it expired in between
            cache.set(f"{self._key}:failures", 1, timeout=FORGET_SECONDS)
        cache.touch(f"{self._key}:failures", FORGET_SECONDS)
        return delay

    def succeeded(self) -> None:
        """The right password: start counting again from nothing."""
        cache.delete_many([f"{self._key}:failures", f"{self._key}:until"])

    def release(self) -> None:
        """Let the next attempt be checked (call once, whatever the outcome)."""
        cache.delete(f"{self._key}:checking:{self.failures}")


def begin(username: str, address: str | None) -> SignInAttempt:
    """The attempt for ``username`` from ``address``, if it may check a password now.

    Raises:
        SignInDelayed: a delay is running, or another attempt for the same username and
            address is being checked; ``retry_after`` says when to try again and
            ``first`` whether it is the first refusal of this delay (to audit once).
    """
    key = _key(username, address)
    failures = int(cache.get(f"{key}:failures", 0))
    until = float(cache.get(f"{key}:until", 0))
    wait = until - time.time()
    if wait > 0:
        first = cache.add(f"{key}:refused:{failures}", 1, timeout=math.ceil(wait))
        raise SignInDelayed(
            f"too many failed sign-ins for {username!r} from your address: wait "
            f"{math.ceil(wait)} s before trying again (each failure doubles the wait, up to "
            f"{settings.MEDSPLIT['SIGN_IN_MAX_DELAY_SECONDS']} s; the account is not locked)",
            retry_after=math.ceil(wait),
            failures=failures,
            first=first,
        )
    if not cache.add(f"{key}:checking:{failures}", 1, timeout=CHECK_SECONDS):
        raise SignInDelayed(
            f"another sign-in for {username!r} from your address is being checked: "
            "try again in a second",
            retry_after=1,
            failures=failures,
            first=False,
        )
    return SignInAttempt(username, address, failures, key)


def _key(username: str, address: str | None) -> str:
    # Hashed: a username may hold any character, and the cache's keys should not.
    who = f"{username.casefold()}\0{address or ''}".encode()
    return f"sign-in:{hashlib.sha256(who).hexdigest()[:32]}"
