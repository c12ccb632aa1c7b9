"""The suite's password hasher: Django's PBKDF2 with few iterations.

Django's default (about a million iterations) spends a quarter of a CPU second on each password
set or checked, and the suite makes hundreds of console users. The hash keeps the default's
algorithm name and records its iteration count, so a web server or worker the suite starts
(default hashers) still verifies it."""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000
