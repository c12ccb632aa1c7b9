"""REST API v1: tools declared without code (docs/tools.md, "Tools declared without code"), for
admins. POST /tools/declared declares one (version 1), PATCH /tools/declared/{name} makes a new
version, GET reads them (with their versions). The service (runtime.tool_declarations) checks
the right and every field, naming the field it refuses; the serializers here describe the
bodies for the schema. The credential is write-only: an answer says whether one is set."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import schema as doc
from console.api import serializers as s
from console.api.auth import actor_of
from console.api.idempotency import idempotent
from console.api.views import ApiView
from runtime import policy
from runtime import tool_declarations as declarations
from runtime.actors import ROLES
from runtime.approval_gate import MAX_APPROVAL_TIMEOUT_SECONDS
from runtime.errors import InvalidInput
from runtime.models import DeclaredToolVersion
from runtime.models.tools import DeclaredToolKind
from runtime.selectors.tool_declarations import Declaration, tool_declaration, tool_declarations
from runtime.tool_definitions import MAX_APPROVERS

# The catalogue's order (console.api.schema.ToolSerializer): one ContractEnum in the schema.
CONTRACTS = ("replay", "lookup", "none", "pure")

# --- requests -------------------------------------------------------------------------------


class DeclaredApprovalIn(serializers.Serializer):
    required = serializers.ChoiceField(  # type: ignore[assignment]
        choices=("never", "always", "conditional"), required=False
    )
    param = s.Text(
        max_length=200, required=False, help_text="conditional: the number parameter weighed."
    )
    above = serializers.FloatField(
        required=False, help_text="conditional: approval when the parameter is above this."
    )
    approver_role = serializers.ChoiceField(choices=ROLES, required=False)
    timeout_seconds = s.Int(min_value=1, max_value=MAX_APPROVAL_TIMEOUT_SECONDS, required=False)
    approvers = s.Int(
        min_value=1,
        max_value=MAX_APPROVERS,
        required=False,
        help_text="How many distinct people must approve a call (1 by default; 2: the "
        "two-person rule), always or, with approvers_param, above approvers_above.",
    )
    approvers_param = s.Text(
        max_length=200,
        required=False,
        help_text="The number parameter above which approvers apply (below it, one approver).",
    )
    approvers_above = serializers.FloatField(
        required=False, help_text="With approvers_param: the threshold of the two-person rule."
    )


class DeclaredAuthIn(serializers.Serializer):
    type = serializers.ChoiceField(choices=declarations.AUTH_TYPES, required=False)
    header = s.Text(max_length=100, required=False, help_text="type header: its name.")
    secret = s.Text(
        max_length=4096,
        required=False,
        help_text="Sealed when stored, never shown again; left out of an edit, kept.",
    )


class _DefinitionIn(serializers.Serializer):
    description = s.Text(max_length=1000, required=False, allow_blank=True)
    params_schema = serializers.DictField(
        required=False, help_text='A JSON Schema with "type": "object" (default: any object).'
    )
    approval = DeclaredApprovalIn(required=False)
    max_attempts = s.Int(min_value=1, max_value=declarations.MAX_ATTEMPTS, required=False)
    tool_class = s.Text(max_length=200, required=False, allow_blank=True)
    url = s.Text(max_length=2000, required=False, help_text="HTTP tools: where the call goes.")
    method = serializers.ChoiceField(choices=declarations.METHODS, required=False)
    idempotency_header = s.Text(
        max_length=100,
        required=False,
        help_text="The header the receiver dedupes by (default Idempotency-Key).",
    )
    auth = DeclaredAuthIn(required=False)
    timeout_seconds = s.Int(min_value=1, max_value=declarations.MAX_TIMEOUT_SECONDS, required=False)
    lookup_url = s.Text(
        max_length=2000, required=False, allow_null=True, help_text="Contract lookup only."
    )


class DeclaredToolIn(_DefinitionIn):
    name = s.Text(min_length=1, max_length=200)
    kind = serializers.ChoiceField(choices=DeclaredToolKind.ALL)
    contract = serializers.ChoiceField(choices=CONTRACTS)


class DeclaredToolPatchIn(_DefinitionIn):
    offered = serializers.BooleanField(
        required=False, help_text="false retires the tool (work recorded before runs on)."
    )
    version = s.Int(
        min_value=1,
        required=False,
        help_text="The version the edit is based on: 409 state_version_mismatch if not current.",
    )


def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise InvalidInput("the body must be a JSON object")
    return dict(request.data)


# --- responses ------------------------------------------------------------------------------


def declared_out(row: DeclaredToolVersion) -> dict[str, Any]:
    tool = row.tool
    definition = row.definition
    http = None
    if tool.kind == DeclaredToolKind.HTTP:
        auth = definition.get("auth") or {"type": "none"}
        http = {
            "url": definition["url"],
            "method": definition["method"],
            "idempotency_header": definition["idempotency_header"],
            "timeout_seconds": definition["timeout_seconds"],
            "lookup_url": definition.get("lookup_url"),
            "auth": {
                "type": auth.get("type", "none"),
                "header": auth.get("header"),
                "secret_set": bool(row.secret_sealed),
            },
        }
    approval = definition.get("approval") or {"required": "never"}
    return {
        "name": tool.pk,
        "kind": tool.kind,
        "contract": tool.contract,
        "version": row.version,
        "offered": row.offered,
        "description": definition.get("description", ""),
        "params_schema": definition.get("params_schema", {"type": "object"}),
        "approval": {
            "required": approval.get("required", "never"),
            "param": approval.get("param"),
            "above": approval.get("above"),
            "approver_role": approval.get("approver_role"),
            "timeout_seconds": approval.get("timeout_seconds"),
            "approvers": approval.get("approvers", 1),
            "approvers_param": approval.get("approvers_param"),
            "approvers_above": approval.get("approvers_above"),
        },
        "max_attempts": definition.get("max_attempts", 5),
        "tool_class": definition.get("tool_class") or None,
        "http": http,
        "created_by": tool.created_by,
        "created_at": s.iso(tool.created_at),
        "version_by": row.created_by,
        "version_at": s.iso(row.created_at),
    }


def declaration_out(declaration: Declaration) -> dict[str, Any]:
    return {
        **declared_out(declaration.row),
        "versions": [
            {
                "version": v.version,
                "offered": v.offered,
                "by": v.created_by,
                "at": s.iso(v.created_at),
            }
            for v in declaration.versions
        ],
    }


# --- schema components ----------------------------------------------------------------------


class DeclaredApprovalSerializer(serializers.Serializer):
    required = serializers.ChoiceField(  # type: ignore[assignment]
        choices=("never", "always", "conditional")
    )
    param = serializers.CharField(allow_null=True)
    above = serializers.FloatField(allow_null=True)
    approver_role = serializers.CharField(allow_null=True)
    timeout_seconds = serializers.IntegerField(allow_null=True)
    approvers = serializers.IntegerField(min_value=1)
    approvers_param = serializers.CharField(allow_null=True)
    approvers_above = serializers.FloatField(allow_null=True)


class DeclaredAuthSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=declarations.AUTH_TYPES)
    header = serializers.CharField(allow_null=True)
    secret_set = serializers.BooleanField(help_text="Whether a credential is sealed for it.")


class DeclaredHttpSerializer(serializers.Serializer):
    url = serializers.CharField()
    method = serializers.ChoiceField(choices=declarations.METHODS)
    idempotency_header = serializers.CharField()
    timeout_seconds = serializers.IntegerField()
    lookup_url = serializers.CharField(allow_null=True)
    auth = DeclaredAuthSerializer()


class DeclaredToolSerializer(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=DeclaredToolKind.ALL)
    contract = serializers.ChoiceField(choices=CONTRACTS)
    version = serializers.IntegerField(min_value=1)
    offered = serializers.BooleanField()
    description = serializers.CharField(allow_blank=True)
    params_schema = serializers.DictField()
    approval = DeclaredApprovalSerializer()
    max_attempts = serializers.IntegerField(min_value=1)
    tool_class = serializers.CharField(allow_null=True)
    http = DeclaredHttpSerializer(allow_null=True, help_text="HTTP tools only.")
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    version_by = serializers.CharField(help_text="Who made this version.")
    version_at = serializers.DateTimeField()


class DeclaredVersionSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1)
    offered = serializers.BooleanField()
    by = serializers.CharField()
    at = serializers.DateTimeField()


class DeclaredToolDetailSerializer(DeclaredToolSerializer):
    versions = DeclaredVersionSerializer(many=True, help_text="Every version, newest first.")


class DeclaredToolListSerializer(serializers.Serializer):
    results = DeclaredToolSerializer(many=True)


# --- views ----------------------------------------------------------------------------------

# A tool's name, as declarations take it (runtime.tool_definitions): not an id's pattern.
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$"
NAME = OpenApiParameter(
    "name",
    {"type": "string", "pattern": NAME_PATTERN, "maxLength": 200},
    OpenApiParameter.PATH,
    description="The declared tool's name.",
)


class DeclaredToolCollection(ApiView):
    @extend_schema(
        operation_id="v1_tools_declared_list",
        responses=doc.responses({200: DeclaredToolListSerializer}),
    )
    def get(self, request: Request) -> Response:
        rows = tool_declarations(actor_of(request))
        return Response({"results": [declared_out(d.row) for d in rows]})

    @extend_schema(
        operation_id="v1_tools_declared_create",
        request=DeclaredToolIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({201: DeclaredToolDetailSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request) -> Response:
        declared = declarations.tool_declare(actor_of(request), _body(request))
        return Response(declaration_out(declared), status=201)


class DeclaredToolDetail(ApiView):
    @extend_schema(
        operation_id="v1_tools_declared_retrieve",
        parameters=[NAME],
        responses=doc.responses({200: DeclaredToolDetailSerializer}),
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(declaration_out(tool_declaration(actor_of(request), name)))

    @extend_schema(
        operation_id="v1_tools_declared_partial_update",
        parameters=[NAME],
        request=DeclaredToolPatchIn,
        responses=doc.responses({200: DeclaredToolDetailSerializer}, write=True),
    )
    def patch(self, request: Request, name: str) -> Response:
        actor = actor_of(request)
        policy.can_declare_tools(actor)  # a refusal before anything of the body is judged
        changes = _body(request)
        version = changes.pop("version", None)
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise InvalidInput("version must be a whole number", field="version")
        edited = declarations.tool_edit(actor, name, changes, version=version)
        return Response(declaration_out(edited))
