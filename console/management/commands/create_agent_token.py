from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runtime.errors import InvalidInput
from runtime.tokens import token_issue_for_agent, token_issue_for_user


class Command(BaseCommand):
    help = (
        "Create an API token for an agent (or, with --user, one acting as that console user). "
        "The token is the last line printed; only its digest is stored. The operator at the "
        "shell may mint for any agent or user; the token records system:cli as its minter."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the agent's name (or the token's name with --user)")
        parser.add_argument("--user", help="make a token that acts as this console user")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options.get("user"):
                issued = token_issue_for_user(options["user"], token_name=options["name"])
                self.stdout.write(f"token {issued.token.pk} acts as user {options['user']}")
            else:
                issued = token_issue_for_agent(options["name"])
                self.stdout.write(f"token {issued.token.pk} for agent {options['name']}")
        except InvalidInput as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(issued.secret)
