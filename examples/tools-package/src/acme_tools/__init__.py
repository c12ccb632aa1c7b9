"""Example tools for the agent console (docs/tools.md). The console calls ``register_tools``
once at start, through the entry point ``acme`` of the group ``agent_console.tools``
(pyproject.toml); the same function can be named in TOOL_MODULES instead
(``TOOL_MODULES=acme_tools:register_tools``)."""

from __future__ import annotations

from acme_tools.billing import SendInvoice, VoidInvoice
from acme_tools.crm import CreateContact
from runtime.tools import register

__all__ = ["CreateContact", "SendInvoice", "VoidInvoice", "register_tools"]


def register_tools() -> None:
    register(CreateContact())
    register(SendInvoice())
    register(VoidInvoice())
