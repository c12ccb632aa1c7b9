"""Console accounts: Django users whose role is one of the console groups."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils.crypto import constant_time_compare

from runtime.actors import ROLES
from runtime.errors import InvalidInput


def console_user_create(username: str, role: str, password: str) -> Any:
    """Create the user, or reset its password and role; one role per user."""
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}")
    if not username.strip():
        raise InvalidInput("username must not be empty")
    if len(password) < 8:
        raise InvalidInput("password must have at least 8 characters")
    user_model = get_user_model()
    with transaction.atomic():
        user, _ = user_model.objects.get_or_create(username=username.strip())
        user.set_password(password)
        user.is_active = True
        user.save()
        groups = [Group.objects.get_or_create(name=r)[0] for r in ROLES]
        user.groups.remove(*groups)
        user.groups.add(Group.objects.get(name=role))
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
