"""Is a password an operator supplies strong enough for the relay?

Redis answers tens of thousands of ``AUTH`` attempts a second (about 60,000 on one core
here), and nothing slows an online guesser down, so a password that guards the relay must
be a machine secret, not a memorable phrase: at least :data:`MIN_BITS` bits by the
estimate below. The passwords MedSplit makes itself (``secrets.token_urlsafe(32)``) have
256.

The estimate is deliberately simple and errs low: the characters' pool (lower case, upper
case, digits, others; a kind counts only when at least two different characters of it
appear, so a lone separator or capital adds nothing) to the power of the length, where
a character repeated beyond twice the number of distinct ones adds nothing either. It is
not a judge of human passphrases (a library such as zxcvbn is), only a floor under secrets
meant to be random.
"""

from __future__ import annotations

import math
import string

from medsplit.errors import ConfigError

MIN_BITS = 128
MIN_LENGTH = 20
#: How to make a good one, for the error message.
ADVICE = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"

_POOLS = (
    (frozenset(string.ascii_lowercase), 26),
    (frozenset(string.ascii_uppercase), 26),
    (frozenset(string.digits), 10),
)
_OTHERS = 33  # printable ASCII punctuation and space


class WeakPasswordError(ConfigError):
    """A password guarding the relay is too weak; the message says how to make one."""


def estimated_bits(password: str) -> float:
    """A low estimate of the password's entropy in bits (see the module docstring)."""
    if not password:
        return 0.0
    chars = set(password)
    pool = sum(size for members, size in _POOLS if len(chars & members) >= 2)
    if len(chars - frozenset().union(*(members for members, _ in _POOLS))) >= 2:
        pool += _OTHERS
    length = min(len(password), 2 * len(chars))
    return length * math.log2(pool) if pool > 1 else 0.0


def check_password(password: str, *, what: str) -> None:
    """Refuse a weak password for ``what`` (an environment variable's name, say).

    Raises:
        WeakPasswordError: shorter than :data:`MIN_LENGTH` or under :data:`MIN_BITS` bits.
    """
    bits = estimated_bits(password)
    if len(password) >= MIN_LENGTH and bits >= MIN_BITS:
        return
    raise WeakPasswordError(
        f"{what} is too weak to guard the relay: about {bits:.0f} bits in {len(password)} "
        f"characters, at least {MIN_BITS} bits and {MIN_LENGTH} characters are needed (Redis "
        f"answers tens of thousands of guesses a second). Make one with: {ADVICE}"
    )
