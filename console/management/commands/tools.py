from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runtime.tools.base import tool_catalogue
from runtime.tools.loading import tool_origin


class Command(BaseCommand):
    help = (
        "List the tools this process offers (the catalogue of GET /api/v1/tools) and where each "
        "came from: built in, a TOOL_MODULES entry or an entry point of agent_console.tools. "
        "Run it where a worker runs to see that worker's catalogue."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="one JSON document")

    def handle(self, *args: Any, **options: Any) -> None:
        tools = [{**entry, "origin": tool_origin(entry["name"])} for entry in tool_catalogue()]
        if options["json"]:
            self.stdout.write(json.dumps({"tools": tools}, indent=2))
            return
        for tool in tools:
            self.stdout.write(
                f"{tool['name']} (version {tool['version']}, contract {tool['contract']}): "
                f"{tool['origin']}"
            )
