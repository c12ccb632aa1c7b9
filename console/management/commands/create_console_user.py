from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runtime.accounts import console_user_create
from runtime.actors import ROLES
from runtime.errors import InvalidInput


class Command(BaseCommand):
    help = "Create (or update) a console user with one role: operator, support or admin."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=ROLES)
        parser.add_argument("--password", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            user = console_user_create(options["username"], options["role"], options["password"])
        except InvalidInput as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"user {user.get_username()} has role {options['role']}")
