from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runtime.tools.base import declared_refresh, tool_catalogue
from runtime.tools.loading import tool_origin


class Command(BaseCommand):
    help = (
        "List the tools this process offers (the catalogue of GET /api/v1/tools) and where each "
        "came from: built in, a TOOL_MODULES entry, an entry point of agent_console.tools, or "
        "declared in the console. "
        "Run it where a worker runs to see that worker's catalogue."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="one JSON document")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            declared_refresh()  # the tools declared in the console, as the workers will see them
        except Exception as exc:
            # The code's tools are the listing's point: listed without a database too.
            self.stderr.write(f"tools declared in the console not read: {exc}".splitlines()[0])
        tools = [{**entry, "origin": tool_origin(entry["name"])} for entry in tool_catalogue()]
        if options["json"]:
            self.stdout.write(json.dumps({"tools": tools}, indent=2))
            return
        for tool in tools:
            self.stdout.write(
                f"{tool['name']} (version {tool['version']}, contract {tool['contract']}): "
                f"{tool['origin']}"
            )
