"""Console accounts: Django users whose role is one of the console groups."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

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
