"""The coordinator's own settings for the deployment the attacker tests start
(tests/security/proxy.py), with one change: a fast password hasher, so that the tests'
people (made with it, tests/platform_apps/conftest.py) can sign in, and a sign-in costs
milliseconds instead of PBKDF2's deliberate second. Nothing tested depends on the hasher."""

from coordinator.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
