"""A typed Python client for the agent console's REST API.

``Client`` (sync) and ``AsyncClient`` share one core (``agent_console_client._core``): every
POST carries an ``Idempotency-Key`` made once per logical call, retries happen only on
connection errors, 5xx, 429 and 409 ``request_in_progress`` (honouring ``Retry-After``), and
errors are typed by ``error.code`` (``agent_console_client.errors``). Every route of the API is
a method of both, generated from the schema with its typed models (``agent_console_client.schema``).

    from agent_console_client import Client

    with Client(base_url="http://127.0.0.1:8000", token=TOKEN) as console:
        task = console.create_task("say hello")
        op = console.propose(task.id, "demo.echo", {"text": "hello"}, step="greet")
        print(console.wait_operation(op.id).result)
"""

from agent_console_client import errors
from agent_console_client._async import AsyncClient, AsyncLease
from agent_console_client._core import RetryPolicy
from agent_console_client._generated import models as schema
from agent_console_client._sync import Client, Lease
from agent_console_client.errors import ConsoleError, StaleLease
from agent_console_client.models import (
    HUMAN_STATUSES,
    TERMINAL_STATUSES,
    Approval,
    Artifact,
    Budget,
    Event,
    LeaseGrant,
    Operation,
    Task,
)
from agent_console_client.webhooks import webhook_signature_valid

__all__ = [
    "HUMAN_STATUSES",
    "TERMINAL_STATUSES",
    "Approval",
    "Artifact",
    "AsyncClient",
    "AsyncLease",
    "Budget",
    "Client",
    "ConsoleError",
    "Event",
    "Lease",
    "LeaseGrant",
    "Operation",
    "RetryPolicy",
    "StaleLease",
    "Task",
    "errors",
    "schema",
    "webhook_signature_valid",
]
