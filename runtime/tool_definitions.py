"""What a declaration of a tool without code may hold (runtime.tool_declarations stores it):
each field checked, the first refusal a 400 ``invalid_input`` naming the field, before anything
is stored. Pure but for the credential, which comes back sealed
(runtime.tools.declared.secret_seal), and the parameter schema, compiled as a proposal would
compile it."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from runtime.actors import ROLES
from runtime.address_guard import url_validate
from runtime.approval_gate import MAX_APPROVAL_TIMEOUT_SECONDS
from runtime.errors import Conflict, InvalidInput
from runtime.jsonschemas import json_schema_compile
from runtime.models.tools import DeclaredToolKind as Kind
from runtime.text import name_check
from runtime.tools.base import Contract, registered
from runtime.tools.declared import secret_seal
from runtime.tools.http import FENCING_HEADER, OPERATION_HEADER, SWITCH

# As a tool module's names (runtime.tools.loading): what an operation row can hold.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}")
# The console's own families: a later built-in tool must not find its name taken.
RESERVED_PREFIXES = ("check.", "demo.", "model.", "notify.")
METHODS = ("POST", "PUT", "PATCH", "DELETE", "GET")
CONTRACTS = {Kind.HTTP: Contract.ALL, Kind.AGENT: Contract.ALL}
_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~\-]{1,100}")  # an HTTP header name (RFC 9110)
_RESERVED_HEADERS = frozenset(
    h.lower()
    for h in (
        "Host",
        "Content-Length",
        "Content-Type",
        "Transfer-Encoding",
        "Connection",
        "Accept",
        "User-Agent",
        FENCING_HEADER,
        OPERATION_HEADER,
    )
)
AUTH_TYPES = ("none", "bearer", "header")
MAX_TIMEOUT_SECONDS = 300
MAX_ATTEMPTS = 100
# What every field holds when a declaration leaves it out.
DEFAULTS: dict[str, Any] = {
    "description": "",
    "params_schema": {"type": "object"},
    "approval": {"required": "never"},
    "max_attempts": 5,
    "tool_class": "",
    "method": "POST",
    "idempotency_header": "Idempotency-Key",
    "auth": {"type": "none"},
    "timeout_seconds": 10,
    "lookup_url": None,
}
COMMON = ("description", "params_schema", "approval", "max_attempts", "tool_class")
HTTP = ("url", "method", "idempotency_header", "auth", "timeout_seconds", "lookup_url")
EDITABLE = frozenset((*COMMON, *HTTP, "offered"))


def fields_only(fields: dict[str, Any], allowed: set[str] | frozenset[str]) -> None:
    extra = sorted(set(fields) - set(allowed))
    if extra:
        raise InvalidInput(f"{extra[0]} is not a field of this kind of tool", field=extra[0])


def name_checked(raw: Any) -> str:
    if not isinstance(raw, str) or not _NAME.fullmatch(raw):
        raise InvalidInput(
            "name must be 1 to 200 letters, digits, '.', '_' or '-', starting with a letter or "
            "digit",
            field="name",
        )
    name_check(raw, "name")
    if registered(raw):
        raise Conflict(f"{raw!r} is a built-in tool", code="tool_exists")
    if raw.startswith(RESERVED_PREFIXES):
        raise InvalidInput(
            f"names starting with {', '.join(RESERVED_PREFIXES)} are the console's own",
            field="name",
        )
    return raw


def secret_kept(definition: dict[str, Any], previous: str) -> str:
    """The sealed credential a version keeps when the edit sent none: the previous one, unless
    the version sends none."""
    return previous if (definition.get("auth") or {}).get("type", "none") != "none" else ""


def definition_checked(
    kind: str, contract: str, fields: dict[str, Any], *, previous_secret: str
) -> tuple[dict[str, Any], str | None]:
    """The definition to store, checked, and the newly sealed credential (None: none sent)."""
    schema = _schema(fields.get("params_schema"))
    definition: dict[str, Any] = {
        "description": _text(fields.get("description"), "description", 1000),
        "params_schema": schema,
        "max_attempts": _int(fields.get("max_attempts"), "max_attempts", 1, MAX_ATTEMPTS),
        "tool_class": _tool_class(fields.get("tool_class")),
        "approval": _approval(fields.get("approval"), schema),
    }
    if kind == Kind.AGENT:
        return definition, None
    definition["url"] = _url(fields.get("url"), "url")
    method = fields.get("method")
    if method not in METHODS:
        raise InvalidInput(f"method must be one of {', '.join(METHODS)}", field="method")
    definition["method"] = method
    idempotency_header = _header(fields.get("idempotency_header"), "idempotency_header")
    definition["idempotency_header"] = idempotency_header
    definition["timeout_seconds"] = _int(
        fields.get("timeout_seconds"), "timeout_seconds", 1, MAX_TIMEOUT_SECONDS
    )
    lookup = fields.get("lookup_url")
    if contract == Contract.LOOKUP:
        if not lookup:
            raise InvalidInput(
                "contract lookup needs lookup_url (asked with the key after an unconfirmed call)",
                field="lookup_url",
            )
        definition["lookup_url"] = _url(lookup, "lookup_url")
    elif lookup:
        raise InvalidInput("lookup_url is for contract lookup only", field="lookup_url")
    else:
        definition["lookup_url"] = None
    auth, secret = _auth(fields.get("auth"), idempotency_header, previous_secret)
    definition["auth"] = auth
    return definition, secret


def _auth(raw: Any, idempotency_header: str, previous: str) -> tuple[dict[str, Any], str | None]:
    if not isinstance(raw, dict):
        raise InvalidInput("auth must be an object", field="auth")
    extra = sorted(set(raw) - {"type", "header", "secret"})
    if extra:
        raise InvalidInput(f"auth.{extra[0]} is not a field of auth", field=f"auth.{extra[0]}")
    kind = raw.get("type", "none")
    if kind not in AUTH_TYPES:
        raise InvalidInput(f"auth.type must be one of {', '.join(AUTH_TYPES)}", field="auth.type")
    if kind == "none":
        return {"type": "none"}, None
    auth: dict[str, Any] = {"type": kind}
    if kind == "header":
        header = _header(raw.get("header"), "auth.header")
        if header.lower() in (idempotency_header.lower(), "authorization"):
            raise InvalidInput(
                "auth.header must differ from idempotency_header and Authorization",
                field="auth.header",
            )
        auth["header"] = header
    secret = raw.get("secret")
    if secret is None or secret == "":
        if not previous:
            raise InvalidInput(f"auth type {kind} needs auth.secret", field="auth.secret")
        return auth, None
    if not isinstance(secret, str) or not 1 <= len(secret) <= 4096:
        raise InvalidInput("auth.secret must be 1 to 4096 characters", field="auth.secret")
    if not all(" " <= ch <= "~" for ch in secret) or secret != secret.strip():
        # It travels in a header: a CR or LF would end it and start another.
        raise InvalidInput(
            "auth.secret must be printable ASCII without surrounding spaces", field="auth.secret"
        )
    return auth, secret_seal(secret)


def _approval(raw: Any, schema: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidInput("approval must be an object", field="approval")
    extra = sorted(set(raw) - {"required", "param", "above", "approver_role", "timeout_seconds"})
    extra = sorted(set(extra) - set(_APPROVERS_FIELDS))
    if extra:
        raise InvalidInput(f"approval.{extra[0]} is not a field", field=f"approval.{extra[0]}")
    required = raw.get("required", "never")
    if required not in ("never", "always", "conditional"):
        raise InvalidInput(
            "approval.required must be never, always or conditional", field="approval.required"
        )
    if required == "never":
        if any(k in raw for k in _APPROVERS_FIELDS) and raw.get("approvers", 1) != 1:
            raise InvalidInput(
                "approval.approvers needs approval.required always or conditional",
                field="approval.approvers",
            )
        return {"required": "never"}
    role = raw.get("approver_role", "operator")
    if role not in ROLES:
        raise InvalidInput(
            f"approval.approver_role must be one of {', '.join(ROLES)}",
            field="approval.approver_role",
        )
    approval = {
        "required": required,
        "approver_role": role,
        "timeout_seconds": _int(
            raw.get("timeout_seconds", 3600),
            "approval.timeout_seconds",
            1,
            MAX_APPROVAL_TIMEOUT_SECONDS,
        ),
    }
    if required == "conditional":
        param = raw.get("param")
        prop = (schema.get("properties") or {}).get(param) if isinstance(param, str) else None
        if not isinstance(prop, dict) or prop.get("type") not in ("integer", "number"):
            raise InvalidInput(
                "approval.param must name a parameter params_schema declares as a number "
                '("type": "integer" or "number")',
                field="approval.param",
            )
        above = raw.get("above")
        if isinstance(above, bool) or not isinstance(above, int | float):
            raise InvalidInput("approval.above must be a number", field="approval.above")
        approval.update({"param": param, "above": above})
    approval.update(_approvers(raw, schema))
    return approval


# The two-person rule of a declared tool: ``approvers`` distinct people (1 by default), always or,
# with ``approvers_param`` and ``approvers_above``, when that number parameter is above it.
_APPROVERS_FIELDS = ("approvers", "approvers_param", "approvers_above")
MAX_APPROVERS = 5


def _approvers(raw: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The rule's fields to store: none for one approver (the definition as before)."""
    count = _int(raw.get("approvers", 1), "approval.approvers", 1, MAX_APPROVERS)
    param, above = raw.get("approvers_param"), raw.get("approvers_above")
    if count == 1:
        if param is not None or above is not None:
            raise InvalidInput(
                "approval.approvers_param and approvers_above need approval.approvers above 1",
                field="approval.approvers_param"
                if param is not None
                else "approval.approvers_above",
            )
        return {}
    if param is None and above is None:
        return {"approvers": count}
    prop = (schema.get("properties") or {}).get(param) if isinstance(param, str) else None
    if not isinstance(prop, dict) or prop.get("type") not in ("integer", "number"):
        raise InvalidInput(
            "approval.approvers_param must name a parameter params_schema declares as a number",
            field="approval.approvers_param",
        )
    if isinstance(above, bool) or not isinstance(above, int | float):
        raise InvalidInput(
            "approval.approvers_above must be a number", field="approval.approvers_above"
        )
    return {"approvers": count, "approvers_param": param, "approvers_above": above}


def _schema(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict) or raw.get("type") != "object":
        raise InvalidInput(
            'params_schema must be a JSON Schema with "type": "object"', field="params_schema"
        )
    json_schema_compile(raw)  # 400 naming params_schema for anything a proposal would trip on
    return raw


def _url(raw: Any, field: str) -> str:
    if not isinstance(raw, str):
        raise InvalidInput(f"{field} must be an http:// or https:// URL", field=field)
    try:
        url = url_validate(raw, switch=SWITCH)
    except InvalidInput as exc:
        raise InvalidInput(exc.message.replace("url", field, 1), field=field) from None
    if "@" in urlsplit(url).netloc:
        raise InvalidInput(
            f"{field} must not carry a user or password: put the credential in auth", field=field
        )
    return url


def _header(raw: Any, field: str) -> str:
    if not isinstance(raw, str) or not _TOKEN.fullmatch(raw):
        raise InvalidInput(f"{field} must be an HTTP header name", field=field)
    if raw.lower() in _RESERVED_HEADERS:
        raise InvalidInput(f"{field} names a header the console sets itself", field=field)
    return raw


def _tool_class(raw: Any) -> str:
    """A concurrency class (TOOL_CONCURRENCY, TOOL_QUEUES name it): empty, the tool's own."""
    text = _text(raw, "tool_class", 200)
    if text and not _NAME.fullmatch(text):
        raise InvalidInput(
            "tool_class must be letters, digits, '.', '_' or '-' (or empty)", field="tool_class"
        )
    return text


def _text(raw: Any, field: str, limit: int) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str) or len(raw) > limit:
        raise InvalidInput(f"{field} must be text of at most {limit} characters", field=field)
    return raw


def _int(raw: Any, field: str, low: int, high: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise InvalidInput(f"{field} must be a whole number from {low} to {high}", field=field)
    return raw
