"""The tools in the console: /tools/ (the catalogue every console role reads; for admins, the tools
declared without code and a form to declare one) and /tools/declared/<name>/ (a declared tool,
its versions and the form that makes the next one). The forms go through the same service as
the API (runtime.tool_declarations), which asks runtime.policy.can_declare_tools first: a
person without the right gets the 403 page whatever the form says."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from console.api.parsers import json_problem
from console.web.decorators import console_view
from console.web.humans import json_for_editing
from console.web.operation_page import pretty
from runtime import policy
from runtime import tool_declarations as declarations
from runtime.actors import ROLES, Actor
from runtime.errors import DomainError, InvalidInput, NotAuthorized
from runtime.models.tools import DeclaredToolKind
from runtime.selectors.tool_declarations import tool_declaration, tool_declarations
from runtime.tools.base import Contract, declared_refresh, tool_catalogue


def _choices() -> dict[str, Any]:
    return {
        "kinds": DeclaredToolKind.ALL,
        "contracts": Contract.ALL,
        "methods": declarations.METHODS,
        "auth_types": declarations.AUTH_TYPES,
        "roles": ROLES,
        "approvals": ("never", "always", "conditional"),
    }


def _page(
    request: HttpRequest,
    actor: Actor,
    *,
    form: dict[str, Any] | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    policy.can_read_tool_catalogue(actor)
    admin = policy.allowed(policy.can_declare_tools, actor)
    declared_refresh()
    tools = [
        {
            **entry,
            "schema_text": pretty(entry["params_schema"]),
            "agent_run": entry["executors"] == ["agent"],
        }
        for entry in tool_catalogue()
    ]
    context = {
        "tools": tools,
        "admin": admin,
        "declared": [d.row for d in tool_declarations(actor)] if admin else [],
        "form": form or {"kind": "http", "contract": "replay", "method": "POST"},
        "error": error,
        **_choices(),
    }
    return render(request, "console/tools.html", context, status=status)


@require_GET
@console_view
def tool_list(request: HttpRequest, actor: Actor) -> HttpResponse:
    return _page(request, actor)


def _json(request: HttpRequest, name: str) -> Any:
    raw = request.POST.get(name, "").strip()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise InvalidInput(f"{name} is not JSON", field=name) from None


def _int(request: HttpRequest, name: str, field: str | None = None) -> int | None:
    raw = request.POST.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(f"{field or name} must be a whole number", field=field or name) from None


def _number(request: HttpRequest, name: str, field: str) -> float | int | None:
    raw = request.POST.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(f"{field} must be a number", field=field) from None
    return int(value) if value.is_integer() else value


def _fields(request: HttpRequest, *, http: bool) -> dict[str, Any]:
    """The form as the API's body (the same service checks it); a field left empty is the
    declaration's default (a new tool) or what the tool had (an edit), the credential included."""
    problem = json_problem({k: request.POST.getlist(k) for k in request.POST})
    if problem:
        raise InvalidInput(problem)
    fields: dict[str, Any] = {
        "description": request.POST.get("description", "")[:2000],
        "max_attempts": _int(request, "max_attempts"),
        "tool_class": request.POST.get("tool_class", "").strip()[:300],
        "params_schema": _json(request, "params_schema"),
    }
    required = request.POST.get("approval_required", "never")
    approval: dict[str, Any] = {"required": required}
    if required != "never":
        approval["approver_role"] = request.POST.get("approver_role", "operator")
        approval["timeout_seconds"] = _int(
            request, "approval_timeout_seconds", "approval.timeout_seconds"
        )
        # The two-person rule: left empty, one approver.
        approval["approvers"] = _int(request, "approvers", "approval.approvers")
        approval["approvers_param"] = request.POST.get("approvers_param", "").strip() or None
        approval["approvers_above"] = _number(
            request, "approvers_above", "approval.approvers_above"
        )
    if required == "conditional":
        approval["param"] = request.POST.get("approval_param", "").strip()
        approval["above"] = _number(request, "approval_above", "approval.above")
    fields["approval"] = {k: v for k, v in approval.items() if v is not None}
    if http:
        auth: dict[str, Any] = {"type": request.POST.get("auth_type", "none")}
        if request.POST.get("auth_header", "").strip():
            auth["header"] = request.POST["auth_header"].strip()
        if request.POST.get("auth_secret", ""):
            auth["secret"] = request.POST["auth_secret"]
        fields.update(
            {
                "url": request.POST.get("url", "").strip()[:2100],
                "method": request.POST.get("method") or None,
                "idempotency_header": request.POST.get("idempotency_header", "").strip()[:200]
                or None,
                "timeout_seconds": _int(request, "timeout_seconds"),
                "lookup_url": request.POST.get("lookup_url", "").strip()[:2100] or None,
                "auth": auth,
            }
        )
    # Left empty: the default (a new tool) or what the tool had (an edit). Text fields stay as
    # typed, so a description can be emptied.
    return {k: v for k, v in fields.items() if v is not None}


@require_POST
@console_view
def tool_declare(request: HttpRequest, actor: Actor) -> HttpResponse:
    # The right first: a person without it gets the 403 page whatever the form says.
    policy.can_declare_tools(actor)
    kind = request.POST.get("kind", "")
    try:
        fields = _fields(request, http=kind == DeclaredToolKind.HTTP)
        fields.update(
            name=request.POST.get("name", "").strip()[:300],
            kind=kind,
            contract=request.POST.get("contract", ""),
        )
        declared = declarations.tool_declare(actor, fields)
    except NotAuthorized:
        raise
    except DomainError as exc:
        # The form comes back as typed (never the credential), with what was refused.
        typed = {
            k: v for k, v in request.POST.items() if k not in ("auth_secret", "csrfmiddlewaretoken")
        }
        return _page(request, actor, form=typed, error=exc.message, status=exc.status)
    messages.success(
        request, f"{declared.row.tool_id} is declared (version 1): agents may propose it now."
    )
    return HttpResponseRedirect(f"/tools/declared/{declared.row.tool_id}/")


@require_GET
@console_view
def declared_detail(request: HttpRequest, actor: Actor, name: str) -> HttpResponse:
    declared = tool_declaration(actor, name)
    row = declared.row
    definition = row.definition
    approval = definition.get("approval") or {}
    return render(
        request,
        "console/tool_declared.html",
        {
            "row": row,
            "tool": row.tool,
            "d": definition,
            "approval": approval,
            "auth": definition.get("auth") or {"type": "none"},
            "versions": declared.versions,
            "schema": json_for_editing(definition.get("params_schema") or {"type": "object"}),
            **_choices(),
        },
    )


@require_POST
@console_view
def declared_edit(request: HttpRequest, actor: Actor, name: str) -> HttpResponse:
    policy.can_declare_tools(actor)
    before = tool_declaration(actor, name).row
    try:
        changes = _fields(request, http=before.tool.kind == DeclaredToolKind.HTTP)
        changes["offered"] = request.POST.get("offered") == "1"
        edited = declarations.tool_edit(
            actor, name, changes, version=_int(request, "version") or None
        )
    except NotAuthorized:
        raise
    except DomainError as exc:
        messages.error(request, f"{name} was not changed: {exc.message}.")
        return HttpResponseRedirect(f"/tools/declared/{name}/")
    if edited.row.version == before.version:
        messages.info(request, f"{name}: nothing to change.")
    else:
        messages.success(
            request,
            f"{name} is now version {edited.row.version}; work already proposed keeps the "
            "version it was proposed under.",
        )
    return HttpResponseRedirect(f"/tools/declared/{name}/")
