"""Console accounts: Django users whose role is one of the console groups."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from runtime.actors import ROLES
from runtime.errors import InvalidInput
from runtime.models import AuditRecord

# Accounts are made or reset from a shell (manage.py create_console_user, runstack, demo).
SHELL = "system:cli"


def console_user_create(username: str, role: str, password: str, *, actor: str = SHELL) -> Any:
    """Create the user, or reset its password and role; one role per user. Audited (an access
    change, like a token's): who did it, whether the account was new, its role, and whether its
    password changed (never the password)."""
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}")
    if not username.strip():
        raise InvalidInput("username must not be empty")
    if len(password) < 8:
        raise InvalidInput("password must have at least 8 characters")
    user_model = get_user_model()
    with transaction.atomic():
        user, created = user_model.objects.get_or_create(username=username.strip())
        role_before = [g.name for g in user.groups.all() if g.name in ROLES]
        password_changed = created or not user.check_password(password)
        user.set_password(password)
        user.is_active = True
        user.save()
        groups = [Group.objects.get_or_create(name=r)[0] for r in ROLES]
        user.groups.remove(*groups)
        user.groups.add(Group.objects.get(name=role))
        AuditRecord.objects.create(
            at=timezone.now(),
            actor=actor,
            action="account.created" if created else "account.reset",
            subject=f"user:{user.pk}",
            detail={
                "username": user.get_username(),
                "role": role,
                "role_before": role_before,
                "password_changed": password_changed,
            },
        )
    return user


def session_signed_in_as(session_key: str | None, user: Any) -> bool:
    """Whether the browser session ``session_key`` is still signed in as ``user``, read now from
    the session store: False once logged out or expired, or once a password change outdated it
    (Django's own test when it loads a session's user). Reads only: nothing is rotated."""
    if not session_key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    data = store.load()
    if str(data.get(SESSION_KEY)) != str(user.pk):
        return False
    stored = data.get(HASH_SESSION_KEY)
    if not stored:
        return False
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return any(constant_time_compare(stored, h) for h in hashes)
