"""Tools declared without code over the API (issue 36 points 2 and 3): an admin declares an HTTP
tool or an agent-run one (POST /api/v1/tools/declared), each edit is a new version (PATCH), the
catalogue of every process offers it, work in flight keeps its version, non-admins are refused
with nothing changed, the webhook address guard refuses a private address when it is declared,
the credential is sealed and never shown; and the built-in model.call is offered with the demo
tools off, its token usage posted to the task's budget.

No postgres mark: these run on SQLite too (the calls themselves: tests/runtime/test_http_tools.py,
with real workers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone

from runtime.models import AuditRecord, DeclaredTool, DeclaredToolVersion, Operation
from runtime.tools import adapter_at, adapters
from runtime.tools.base import declared_refresh, declared_source_set
from runtime.tools.declared import declarations_forget, secret_open
from tests import factories
from tests.api.support import assert_error, post_json

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _declarations_forgotten() -> Iterator[None]:
    """Each test's database is rolled back under this process's view of the declarations."""
    declarations_forget()
    yield
    declarations_forget()


DECLARED = "/api/v1/tools/declared"
SECRET = "s3cr3t-api-key"


def http_tool(name: str = "acme.crm.create_contact", **overrides: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "kind": "http",
        "contract": "replay",
        "description": "Creates a contact in the CRM.",
        "url": "https://crm.example.com/contacts",
        "method": "POST",
        "idempotency_header": "X-Request-Key",
        "auth": {"type": "bearer", "secret": SECRET},
        "timeout_seconds": 5,
        "params_schema": {
            "type": "object",
            "properties": {"email": {"type": "string"}, "amount": {"type": "integer"}},
            "required": ["email"],
        },
        "approval": {"required": "conditional", "param": "amount", "above": 100},
    }
    body.update(overrides)
    return body


def _catalogue(principal: Any) -> dict[str, dict[str, Any]]:
    response = principal.client().get("/api/v1/tools")
    assert response.status_code == 200, response.content
    return {entry["name"]: entry for entry in response.json()["results"]}


def _propose(owner: Any, task: Any, tool: str, params: Any, **extra: Any) -> Any:
    return post_json(
        owner.client(),
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": tool, "step": extra.pop("step", "s"), "params": params, **extra},
    )


def test_an_admin_declares_an_http_tool_every_caller_sees_it_and_the_secret_stays_sealed():
    admin = factories.console_user("admin")
    response = post_json(admin.client(), DECLARED, http_tool())
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["name"], body["kind"], body["contract"], body["version"]) == (
        "acme.crm.create_contact",
        "http",
        "replay",
        1,
    )
    assert body["http"]["auth"] == {"type": "bearer", "header": None, "secret_set": True}
    assert SECRET not in response.content.decode()
    assert [v["version"] for v in body["versions"]] == [1]

    # In the catalogue of agents and people alike, with its approval rule in words.
    entry = _catalogue(factories.agent())["acme.crm.create_contact"]
    assert entry["declared"] is True and entry["version"] == "1"
    assert entry["contract"] == "replay" and entry["executors"] == ["worker", "agent"]
    assert entry["approval"]["required"] == "conditional"
    assert entry["approval"]["when"] == "amount above 100"
    assert "url" not in entry  # where it goes is the admins' (GET /tools/declared)

    # Sealed at rest, opened only for a call; audited, naming the admin, never the secret.
    row = DeclaredToolVersion.objects.get(tool_id="acme.crm.create_contact", version=1)
    assert SECRET not in row.secret_sealed and secret_open(row.secret_sealed) == SECRET
    assert SECRET not in str(row.definition)
    audit = AuditRecord.objects.get(subject="tool:acme.crm.create_contact")
    assert audit.action == "tool.declared" and audit.actor == admin.actor.label
    assert SECRET not in str(audit.detail) and audit.detail["endpoint"].startswith("https://crm")

    # Proposals are held to its schema and its approval policy.
    owner = factories.agent()
    task = factories.task(owner)
    refused = _propose(owner, task, "acme.crm.create_contact", {"email": 5})
    assert assert_error(refused, 400, "invalid_input")["field"] == "params.email"
    small = _propose(owner, task, "acme.crm.create_contact", {"email": "a@x", "amount": 5})
    assert small.status_code == 201 and small.json()["status"] == "pending"
    big = _propose(
        owner, task, "acme.crm.create_contact", {"email": "b@x", "amount": 500}, step="big"
    )
    assert big.status_code == 201 and big.json()["status"] == "waiting_approval"


PEOPLE_AND_AGENTS = ["agent", "operator", "support"]


@pytest.mark.parametrize("who", PEOPLE_AND_AGENTS)
def test_only_admins_declare_edit_or_read_declarations_and_a_refusal_changes_nothing(who):
    admin = factories.console_user("admin")
    assert post_json(admin.client(), DECLARED, http_tool()).status_code == 201
    other = factories.agent() if who == "agent" else factories.console_user(who)
    client = other.client()
    assert_error(post_json(client, DECLARED, http_tool("acme.other")), 403, "not_authorized")
    assert_error(client.get(DECLARED), 403, "not_authorized")
    assert_error(client.get(f"{DECLARED}/acme.crm.create_contact"), 403, "not_authorized")
    patch = client.patch(
        f"{DECLARED}/acme.crm.create_contact", {"description": "mine now"}, format="json"
    )
    assert_error(patch, 403, "not_authorized")
    assert list(DeclaredTool.objects.values_list("name", "version")) == [
        ("acme.crm.create_contact", 1)
    ]
    assert DeclaredToolVersion.objects.count() == 1
    assert AuditRecord.objects.filter(subject__startswith="tool:").count() == 1


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://10.1.2.3/hook",
        "http://[::1]/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::ffff:192.168.0.1]/x",
        "http://2852039166/",  # 169.254.169.254 as one number
    ],
)
def test_the_address_guard_refuses_a_private_address_at_declaration(url):
    admin = factories.console_user("admin")
    response = post_json(admin.client(), DECLARED, http_tool(url=url))
    error = assert_error(response, 400, "invalid_input")
    assert error["field"] == "url" and "TOOL_ALLOW_PRIVATE_HOSTS" in error["message"]
    lookup = post_json(
        admin.client(),
        DECLARED,
        http_tool(contract="lookup", lookup_url=url),
    )
    assert assert_error(lookup, 400, "invalid_input")["field"] == "lookup_url"
    assert not DeclaredTool.objects.exists()
    assert not AuditRecord.objects.filter(subject__startswith="tool:").exists()
    assert "acme.crm.create_contact" not in adapters()


def test_private_addresses_are_allowed_only_when_the_deployment_says_so(settings):
    settings.TOOL_ALLOW_PRIVATE_HOSTS = True
    admin = factories.console_user("admin")
    response = post_json(admin.client(), DECLARED, http_tool(url="http://127.0.0.1:9/x"))
    assert response.status_code == 201, response.content
    # The webhooks' own switch is another: it does not open the tools' guard, nor this theirs.
    settings.TOOL_ALLOW_PRIVATE_HOSTS = False
    settings.NOTIFY_ALLOW_PRIVATE_HOSTS = True
    refused = post_json(admin.client(), DECLARED, http_tool("acme.b", url="http://10.0.0.1/"))
    assert_error(refused, 400, "invalid_input")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": "demo.echo"}, None),  # built in: 409 tool_exists
        ({"name": "notify.mine"}, "name"),
        ({"name": "has space"}, "name"),
        ({"kind": "ftp"}, "kind"),
        ({"contract": "maybe"}, "contract"),
        ({"params_schema": {"type": "array"}}, "params_schema"),
        ({"params_schema": {"type": "object", "properties": {"a": {"type": 5}}}}, "params_schema"),
        ({"url": "ftp://example.com/x"}, "url"),
        ({"url": "https://user:pw@example.com/x"}, "url"),
        ({"method": "TRACE"}, "method"),
        ({"idempotency_header": "Bad Header"}, "idempotency_header"),
        ({"idempotency_header": "X-Console-Fencing-Token"}, "idempotency_header"),
        ({"auth": {"type": "bearer"}}, "auth.secret"),
        ({"auth": {"type": "bearer", "secret": "a\r\nX-Injected: 1"}}, "auth.secret"),
        ({"auth": {"type": "header", "secret": "k"}}, "auth.header"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
        ({"timeout_seconds": 3600}, "timeout_seconds"),
        ({"contract": "lookup"}, "lookup_url"),
        ({"lookup_url": "https://crm.example.com/find"}, "lookup_url"),
        ({"approval": {"required": "conditional", "param": "email", "above": 1}}, "approval.param"),
        ({"approval": {"required": "always", "approver_role": "boss"}}, "approval.approver_role"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_field_and_stores_nothing(overrides, field):
    admin = factories.console_user("admin")
    response = post_json(admin.client(), DECLARED, http_tool(**overrides))
    if field is None:
        assert_error(response, 409, "tool_exists")
    else:
        assert assert_error(response, 400, "invalid_input")["field"] == field
    assert not DeclaredTool.objects.exists() and not DeclaredToolVersion.objects.exists()


def test_a_name_declared_twice_is_409_tool_exists():
    admin = factories.console_user("admin")
    assert post_json(admin.client(), DECLARED, http_tool()).status_code == 201
    again = post_json(admin.client(), DECLARED, http_tool(description="again"))
    assert_error(again, 409, "tool_exists")
    assert DeclaredToolVersion.objects.count() == 1


def test_an_edit_is_a_new_version_and_work_in_flight_keeps_its_version():
    admin = factories.console_user("admin")
    client = admin.client()
    assert post_json(client, DECLARED, http_tool()).status_code == 201
    owner = factories.agent()
    task = factories.task(owner)
    before = _propose(owner, task, "acme.crm.create_contact", {"email": "a@x"}, step="one")
    assert before.status_code == 201, before.content

    edit = client.patch(
        f"{DECLARED}/acme.crm.create_contact",
        {
            "version": 1,
            "url": "https://crm.example.com/v2/contacts",
            "params_schema": {
                "type": "object",
                "properties": {"email": {"type": "string"}, "name": {"type": "string"}},
                "required": ["email", "name"],
            },
            "approval": {"required": "never"},
        },
        format="json",
    )
    assert edit.status_code == 200, edit.content
    body = edit.json()
    assert body["version"] == 2 and [v["version"] for v in body["versions"]] == [2, 1]
    assert body["http"]["url"] == "https://crm.example.com/v2/contacts"
    assert body["http"]["auth"]["secret_set"] is True  # kept: the edit sent none
    v1 = DeclaredToolVersion.objects.get(tool_id="acme.crm.create_contact", version=1)
    v2 = DeclaredToolVersion.objects.get(tool_id="acme.crm.create_contact", version=2)
    assert v2.secret_sealed == v1.secret_sealed
    assert AuditRecord.objects.filter(action="tool.edited", actor=admin.actor.label).count() == 1

    # New work is recorded under version 2 and held to its schema...
    assert _catalogue(owner)["acme.crm.create_contact"]["version"] == "2"
    refused = _propose(owner, task, "acme.crm.create_contact", {"email": "b@x"}, step="two")
    assert assert_error(refused, 400, "invalid_input")["field"] == "params.name"
    after = _propose(
        owner, task, "acme.crm.create_contact", {"email": "b@x", "name": "B"}, step="two"
    )
    assert after.status_code == 201, after.content
    assert Operation.objects.get(pk=after.json()["id"]).tool_version == "2"
    # ... the work proposed before keeps version 1, whose definition a worker runs for it.
    old = Operation.objects.get(pk=before.json()["id"])
    assert old.tool_version == "1"
    assert adapters()["acme.crm.create_contact"].supports("1")
    recorded = adapter_at("acme.crm.create_contact", old.tool_version)
    assert recorded.definition["url"] == "https://crm.example.com/contacts"  # type: ignore[attr-defined]

    # An edit based on an old version is refused: someone edited it first.
    stale = client.patch(
        f"{DECLARED}/acme.crm.create_contact",
        {"version": 1, "description": "late"},
        format="json",
    )
    assert_error(stale, 409, "state_version_mismatch")
    # The name, the kind and the contract are the tool: another one is declared instead.
    fixed = client.patch(f"{DECLARED}/acme.crm.create_contact", {"contract": "none"}, format="json")
    assert assert_error(fixed, 400, "invalid_input")["field"] == "contract"
    assert DeclaredToolVersion.objects.filter(tool_id="acme.crm.create_contact").count() == 2


def test_a_retired_tool_leaves_the_catalogue_and_takes_no_new_work():
    admin = factories.console_user("admin")
    assert post_json(admin.client(), DECLARED, http_tool()).status_code == 201
    owner = factories.agent()
    task = factories.task(owner)
    op = _propose(owner, task, "acme.crm.create_contact", {"email": "a@x"})
    retired = admin.client().patch(
        f"{DECLARED}/acme.crm.create_contact", {"offered": False}, format="json"
    )
    assert retired.status_code == 200 and retired.json()["offered"] is False
    assert AuditRecord.objects.filter(action="tool.retired").count() == 1
    assert "acme.crm.create_contact" not in _catalogue(owner)
    refused = _propose(owner, task, "acme.crm.create_contact", {"email": "b@x"}, step="b")
    assert_error(refused, 400, "unknown_tool")
    # The work recorded before is still a tool's a worker can run.
    recorded = Operation.objects.get(pk=op.json()["id"])
    assert adapters()["acme.crm.create_contact"].supports(recorded.tool_version)


def test_a_declaration_written_by_another_process_is_seen_without_a_restart():
    """Another process declares (its rows committed; this process's view read before): the
    catalogue and a proposal here find it at their next look."""
    admin = factories.console_user("admin")
    owner = factories.agent()
    task = factories.task(owner)
    assert "acme.later" not in _catalogue(owner)  # this process has read the declarations
    # Rows as the other process's service wrote them (this process is not told).
    now = timezone.now()
    tool = DeclaredTool.objects.create(
        name="acme.later",
        kind="agent",
        contract="none",
        created_by=admin.actor.label,
        created_at=now,
        updated_at=now,
    )
    DeclaredToolVersion.objects.create(
        tool=tool,
        version=1,
        definition={"params_schema": {"type": "object"}, "approval": {"required": "never"}},
        created_by=admin.actor.label,
        created_at=now,
    )
    response = _propose(owner, task, "acme.later", {}, executor="agent")
    assert response.status_code == 201, response.content
    assert "acme.later" in _catalogue(owner)


def test_a_name_another_thread_read_first_is_found():
    """Two requests miss the same new tool at once: one reads the declarations (and finds it)
    while the other waits for the read; the other's own read then finds nothing new, and it
    must still find the tool (it answered unknown_tool: make bench's HTTP part caught it)."""
    adapter = adapters()["check.json_schema"]

    class OneReadBehind:
        def __init__(self) -> None:
            self.tools: dict[str, Any] = {}

        def current(self) -> dict[str, Any]:
            return self.tools

        def refresh(self) -> bool:
            # The other thread's read, just done: the tool is in and the catalogue rebuilt.
            self.tools = {"acme.raced": adapter}
            declared_source_set(self)
            return False  # nothing new for this thread's own read

    try:
        declared_source_set(OneReadBehind())
        assert adapters().get("acme.raced") is adapter
    finally:
        declarations_forget()


def test_an_agent_run_declared_tool_is_proposed_claimed_and_completed_by_its_agent():
    admin = factories.console_user("admin")
    declared = post_json(
        admin.client(),
        DECLARED,
        {
            "name": "research.summarise",
            "kind": "agent",
            "contract": "none",
            "description": "The agent summarises a document itself.",
            "params_schema": {
                "type": "object",
                "properties": {"document": {"type": "string"}},
                "required": ["document"],
            },
        },
    )
    assert declared.status_code == 201, declared.content
    assert declared.json()["http"] is None
    owner = factories.agent()
    task = factories.task(owner)
    assert _catalogue(owner)["research.summarise"]["executors"] == ["agent"]
    # A worker has nothing to call: a proposal for one is refused, naming the field.
    worker = _propose(owner, task, "research.summarise", {"document": "d"})
    assert assert_error(worker, 400, "invalid_input")["field"] == "executor"
    bad = _propose(owner, task, "research.summarise", {}, executor="agent")
    assert assert_error(bad, 400, "invalid_input")["field"] == "params.document"
    # HTTP fields are not an agent-run tool's.
    url = post_json(
        admin.client(),
        DECLARED,
        {"name": "x.y", "kind": "agent", "contract": "none", "url": "https://a.example/"},
    )
    assert assert_error(url, 400, "invalid_input")["field"] == "url"

    op = _propose(owner, task, "research.summarise", {"document": "d"}, executor="agent")
    assert op.status_code == 201, op.content
    op_id = op.json()["id"]
    client = owner.client()
    claim = client.post(f"/api/v1/operations/{op_id}/claim").json()
    done = post_json(
        client,
        f"/api/v1/operations/{op_id}/complete",
        {
            "lease_generation": claim["lease_generation"],
            "lease_token": claim["lease_token"],
            "outcome": "succeeded",
            "result": {"summary": "short"},
        },
    )
    assert done.status_code == 200, done.content
    assert done.json()["status"] == "succeeded" and done.json()["tool"] == "research.summarise"


def test_model_call_is_offered_with_the_demo_tools_off_and_its_tokens_reach_the_budget(settings):
    settings.DEMO_TOOLS = False
    owner = factories.agent()
    tools = _catalogue(owner)
    assert "demo.echo" not in tools
    model = tools["model.call"]
    assert model["executors"] == ["agent"] and model["demo"] is False
    assert model["contract"] == "pure"

    client = owner.client()
    task = post_json(client, "/api/v1/tasks", {"name": "t", "budget": {"model_tokens": 1000}})
    task_id = task.json()["id"]
    op = post_json(
        client,
        f"/api/v1/tasks/{task_id}/operations",
        {
            "tool": "model.call",
            "step": "model-1",
            "executor": "agent",
            "params": {"model": "test-model", "call": 1},
            "estimate": {"model_tokens": 400},
        },
    )
    assert op.status_code == 201, op.content
    # The estimate is held against the limit: a call the budget cannot cover is refused.
    too_big = post_json(
        client,
        f"/api/v1/tasks/{task_id}/operations",
        {
            "tool": "model.call",
            "step": "model-2",
            "executor": "agent",
            "params": {"model": "test-model", "call": 2},
            "estimate": {"model_tokens": 600},
        },
    )
    assert_error(too_big, 409, "budget_exhausted")
    op_id = op.json()["id"]
    claim = client.post(f"/api/v1/operations/{op_id}/claim").json()
    done = post_json(
        client,
        f"/api/v1/operations/{op_id}/complete",
        {
            "lease_generation": claim["lease_generation"],
            "lease_token": claim["lease_token"],
            "outcome": "succeeded",
            "result": {"input_tokens": 200, "output_tokens": 50},
            "usage": {"model_tokens": 250},
        },
    )
    assert done.status_code == 200, done.content
    meter = client.get(f"/api/v1/tasks/{task_id}/budget").json()["meters"]["model_tokens"]
    assert (meter["reserved"], meter["posted"]) == (0, 250)
    # Not a worker's to run.
    worker = post_json(
        client,
        f"/api/v1/tasks/{task_id}/operations",
        {"tool": "model.call", "step": "model-3", "params": {"model": "m"}},
    )
    assert assert_error(worker, 400, "invalid_input")["field"] == "executor"


def test_a_refresh_that_finds_nothing_new_costs_one_statement(django_assert_num_queries):
    admin = factories.console_user("admin")
    assert post_json(admin.client(), DECLARED, http_tool()).status_code == 201
    declared_refresh()
    with django_assert_num_queries(1):
        assert declared_refresh() is False
    # A built-in tool is found without any.
    with django_assert_num_queries(0):
        assert adapters().get("check.json_schema") is not None
        assert adapters().get("") is None


def test_an_approver_edit_of_work_in_flight_is_held_to_its_own_versions_schema():
    admin = factories.console_user("admin")
    created = post_json(
        admin.client(),
        DECLARED,
        http_tool(approval={"required": "always"}),
    )
    assert created.status_code == 201, created.content
    owner = factories.agent()
    task = factories.task(owner)
    gated = _propose(owner, task, "acme.crm.create_contact", {"email": "a@x"})
    assert gated.json()["status"] == "waiting_approval"
    approval_id = gated.json()["approval"]["id"]
    # Version 2 asks for a name too; the proposal stays under version 1.
    edit = admin.client().patch(
        f"{DECLARED}/acme.crm.create_contact",
        {
            "params_schema": {
                "type": "object",
                "properties": {"email": {"type": "string"}, "name": {"type": "string"}},
                "required": ["email", "name"],
            }
        },
        format="json",
    )
    assert edit.status_code == 200 and edit.json()["version"] == 2
    operator = factories.console_user("operator")
    edited = post_json(
        operator.client(),
        f"/api/v1/approvals/{approval_id}/edit",
        {"params": {"email": "b@x"}, "reason": "the right address"},
    )
    assert edited.status_code == 201, edited.content  # valid under version 1, as it runs
    op = Operation.objects.get(pk=gated.json()["id"])
    assert (op.params, op.tool_version) == ({"email": "b@x"}, "1")
    refused = post_json(
        operator.client(),
        f"/api/v1/approvals/{edited.json()['id']}/edit",
        {"params": {"email": 5}, "reason": "typo"},
    )
    assert assert_error(refused, 400, "invalid_input")["field"] == "params.email"
