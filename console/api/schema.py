"""What /api/schema/ says about each endpoint: named components for every response body (the
shapes console.api.serializers renders), the contract's Error for every refusal a client can
provoke, enums and ranges on filters. These serializers only describe; the views render with
the ``*_out`` functions, and tests/api/test_schema_exact.py holds the two together."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_field
from rest_framework import serializers

from console.api import serializers as api
from runtime import resolutions
from runtime.models import Operation, Signal, TaskCommand
from runtime.rules.statuses import (
    ApprovalStatus,
    Cancellation,
    OperationStatus,
    TaskCondition,
    TaskOutcome,
)
from runtime.transitions.propose_wait import MAX_WAIT_SECONDS

# --- components -----------------------------------------------------------------------------


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="A fixed code of the contract (API.md).")
    message = serializers.CharField()
    # Named like Serializer attributes (the metaclass takes declared fields out of the class
    # body, so they do not shadow them at runtime; mypy cannot know that).
    fields = serializers.DictField(  # type: ignore[assignment]
        required=False, help_text="Per-field messages of a validation error."
    )
    field = serializers.CharField(
        required=False, help_text="The field a not_supported_yet refusal is about."
    )


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


class AttemptSerializer(serializers.Serializer):
    id = serializers.CharField()
    number = serializers.IntegerField(min_value=1)


class DirectionSerializer(serializers.Serializer):
    text = serializers.CharField()
    version = serializers.IntegerField(min_value=1)


class TaskSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    input = serializers.DictField()
    condition = serializers.ChoiceField(choices=TaskCondition.ALL)
    outcome = serializers.ChoiceField(choices=TaskOutcome.ALL, allow_null=True)
    terminal_reason = serializers.CharField(allow_null=True)
    state_version = serializers.IntegerField()
    attempt = AttemptSerializer(allow_null=True)
    cancellation = serializers.ChoiceField(choices=Cancellation.ALL)
    paused = serializers.BooleanField()
    direction = DirectionSerializer(
        allow_null=True, help_text="The latest steer (POST /tasks/{id}/steer), or null."
    )
    deadline = serializers.DateTimeField(allow_null=True)
    # (Named like the Serializer attribute; the metaclass takes it out of the class body.)
    parent = serializers.CharField(  # type: ignore[assignment]
        allow_null=True, help_text="The parent task of a child task."
    )
    schedule = serializers.CharField(
        allow_null=True, help_text="The schedule that started the task, or null."
    )
    budget = serializers.DictField(
        child=serializers.IntegerField(min_value=0),
        allow_null=True,
        help_text="The declared limits ({meter: amount}); null without a budget.",
    )
    pending = serializers.ListField(child=serializers.CharField())
    compensate_on = serializers.ListField(
        child=serializers.ChoiceField(choices=["failed", "cancelled"])
    )
    external_id = serializers.CharField(
        allow_null=True, help_text="The key the task was created under (your own), or null."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ApprovalSerializer(serializers.Serializer):
    id = serializers.CharField()
    operation = serializers.CharField()
    task = serializers.CharField()
    status = serializers.ChoiceField(choices=ApprovalStatus.ALL)
    tool = serializers.CharField()
    params_hash = serializers.CharField()
    proposal_version = serializers.IntegerField(min_value=1)
    params = serializers.DictField()
    previous = serializers.CharField(allow_null=True, help_text="The proposal an edit replaced.")
    scope = serializers.CharField()
    approver_role = serializers.CharField()
    requested_by = serializers.CharField()
    edited_by = serializers.CharField(allow_null=True)
    decided_by = serializers.CharField(
        allow_null=True, help_text="Who made it approved or denied (the last approver)."
    )
    decided_at = serializers.DateTimeField(allow_null=True)
    approvals_required = serializers.IntegerField(
        min_value=1,
        help_text="How many distinct people must approve it (the tool's two-person rule, fixed "
        "when it was requested); it stays pending until they have.",
    )
    approved_by = serializers.ListField(
        child=serializers.CharField(),
        help_text="Who approved it so far, the first first (a pending request with fewer than "
        "approvals_required names waits for another approver).",
    )
    reason = serializers.CharField(allow_null=True)
    expires_at = serializers.DateTimeField()
    released_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


class InvocationSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    execution = serializers.CharField(allow_null=True)
    lease_generation = serializers.IntegerField()
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    outcome = serializers.CharField(allow_null=True, allow_blank=True)
    receipt = serializers.JSONField(allow_null=True)
    provider_handle = serializers.CharField(allow_null=True)


class OperationSerializer(serializers.Serializer):
    id = serializers.CharField()
    task = serializers.CharField()
    attempt = serializers.CharField()
    kind = serializers.ChoiceField(choices=Operation.KINDS)
    tool = serializers.CharField(allow_null=True)
    tool_version = serializers.CharField(allow_null=True)
    step = serializers.CharField()
    intent_version = serializers.IntegerField()
    params = serializers.DictField()
    params_hash = serializers.CharField()
    idempotency_key = serializers.CharField()
    executor = serializers.ChoiceField(choices=Operation.EXECUTORS)
    status = serializers.ChoiceField(choices=OperationStatus.ALL)
    status_reason = serializers.CharField(allow_null=True)
    attempts_used = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    lease_generation = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField(allow_null=True)
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    state_version = serializers.IntegerField()
    result = serializers.JSONField(allow_null=True)
    error = serializers.DictField(allow_null=True)
    approval = ApprovalSerializer(allow_null=True)
    compensates = serializers.CharField(allow_null=True)
    invocations = InvocationSerializer(many=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class EventSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="The journal cursor of this event.")
    type = serializers.CharField()
    at = serializers.DateTimeField()
    state_version = serializers.IntegerField()
    operation = serializers.CharField(allow_null=True)
    actor = serializers.CharField(allow_null=True)
    data = serializers.DictField()  # type: ignore[assignment]


class TaskPageSerializer(serializers.Serializer):
    results = TaskSerializer(many=True)
    next = serializers.CharField(allow_null=True, help_text="Cursor of the next page.")


class OperationPageSerializer(serializers.Serializer):
    results = OperationSerializer(many=True)
    next = serializers.CharField(allow_null=True, help_text="Cursor of the next page.")


class OperationListSerializer(serializers.Serializer):
    results = OperationSerializer(many=True)


class EventPageSerializer(serializers.Serializer):
    events = EventSerializer(many=True)
    next = serializers.CharField(help_text="Pass as `after` to read on.")


class LeaseSerializer(serializers.Serializer):
    lease_generation = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField()
    lease_token = serializers.CharField(
        help_text="Secret, shown once: heartbeat and complete need it with the generation."
    )
    state_version = serializers.IntegerField()
    execution = serializers.CharField()
    deadline = serializers.DateTimeField(allow_null=True, help_text="The task's deadline.")
    deadline_remaining_seconds = serializers.FloatField(
        allow_null=True, help_text="What was left of the deadline when the claim began."
    )


class NewAttemptSerializer(serializers.Serializer):
    id = serializers.CharField()
    number = serializers.IntegerField(min_value=1)
    reason = serializers.CharField(allow_blank=True)


class MeterSerializer(serializers.Serializer):
    limit = serializers.IntegerField(min_value=0)
    reserved = serializers.IntegerField(min_value=0)
    posted = serializers.IntegerField(min_value=0)
    unknown = serializers.IntegerField(
        min_value=0, help_text="Held by calls whose usage was lost: a possible liability."
    )
    available = serializers.IntegerField(min_value=0)
    reserve = serializers.IntegerField(
        min_value=0, help_text="Kept for completion checks and compensation."
    )


class BudgetSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(allow_null=True, help_text="The current attempt's number.")
    meters = serializers.DictField(child=MeterSerializer())


class HeartbeatSerializer(serializers.Serializer):
    lease_expires_at = serializers.DateTimeField()
    cancel_requested = serializers.BooleanField()


class ApprovalListSerializer(serializers.Serializer):
    results = ApprovalSerializer(many=True)


class BulkErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class BulkResultSerializer(serializers.Serializer):
    approval = serializers.CharField()
    status = serializers.IntegerField(help_text="The HTTP status this item alone would get.")
    approval_status = serializers.ChoiceField(choices=ApprovalStatus.ALL, required=False)
    approvals_required = serializers.IntegerField(min_value=1, required=False)
    approved_by = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Who approved it so far: an approve that is not the last one required leaves "
        "it pending.",
    )
    error = BulkErrorSerializer(required=False)


class BulkResultsSerializer(serializers.Serializer):
    results = BulkResultSerializer(many=True)


class SignalSerializer(serializers.Serializer):
    id = serializers.CharField()
    event_id = serializers.CharField()
    name = serializers.CharField()
    payload = serializers.DictField()
    disposition = serializers.ChoiceField(choices=Signal.DISPOSITIONS)
    operation = serializers.CharField(allow_null=True)
    received_at = serializers.DateTimeField()
    consumed_at = serializers.DateTimeField(allow_null=True)
    sent_by = serializers.CharField()


class SignalListSerializer(serializers.Serializer):
    results = SignalSerializer(many=True)


class SignalAnswerSerializer(serializers.Serializer):
    disposition = serializers.ChoiceField(choices=Signal.DISPOSITIONS)
    signal = serializers.CharField()
    original_disposition = serializers.ChoiceField(
        choices=Signal.DISPOSITIONS,
        required=False,
        help_text="For a duplicate: the disposition the first copy got.",
    )


class CommandSerializer(serializers.Serializer):
    id = serializers.CharField()
    kind = serializers.ChoiceField(choices=["pause", "resume", "steer"])
    disposition = serializers.ChoiceField(
        choices=[TaskCommand.APPLIED, TaskCommand.NO_CHANGE, TaskCommand.REFUSED]
    )
    detail = serializers.CharField()
    payload = serializers.DictField()
    actor = serializers.CharField()
    at = serializers.DateTimeField()


class TaskCommandSerializer(TaskSerializer):
    """The task after a pause, resume or steer, with the command's id and disposition."""

    command = CommandSerializer()


class EffectsSerializer(serializers.Serializer):
    receiver = serializers.CharField()
    key = serializers.CharField()
    effects = serializers.ListField(child=serializers.DictField())


class ToolApprovalSerializer(serializers.Serializer):
    # (Named like the Field attribute; the metaclass takes it out of the class body.)
    required = serializers.ChoiceField(  # type: ignore[assignment]
        choices=("never", "always", "conditional")
    )
    when = serializers.CharField(
        allow_null=True,
        help_text='When a conditional approval applies ("amount_cents above 10000").',
    )
    approver_role = serializers.CharField(allow_null=True)
    timeout_seconds = serializers.IntegerField(allow_null=True, min_value=1)
    approvers = serializers.IntegerField(
        allow_null=True,
        min_value=1,
        help_text="How many distinct people must approve a gated call (the two-person rule: "
        "2), at most; null when no approval is needed.",
    )
    approvers_when = serializers.CharField(
        allow_null=True,
        help_text='When more than one approver is needed ("amount_cents above 100000"); null: '
        "always (or one approver).",
    )


class ToolSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.CharField()
    description = serializers.CharField()
    contract = serializers.ChoiceField(
        choices=("replay", "lookup", "none", "pure"),
        help_text="What the receiver promises when the same idempotency key arrives twice.",
    )
    approval = ToolApprovalSerializer()
    params_schema = serializers.DictField(
        help_text="A JSON Schema of the tool's params: proposals and edits are validated "
        "against it (400 invalid_input naming the field)."
    )
    compensation_tool = serializers.CharField(allow_null=True)
    max_attempts = serializers.IntegerField(min_value=1)
    demo = serializers.BooleanField(help_text="A sandbox tool (off in production).")
    executors = serializers.ListField(
        child=serializers.ChoiceField(choices=("worker", "agent")),
        help_text='Who may run its calls (the proposal\'s executor): ["agent"] for a step the '
        "agent runs itself (model.call, a declared agent-run tool).",
    )
    declared = serializers.BooleanField(
        help_text="Declared by an admin in the console (GET /api/v1/tools/declared), not code."
    )


class ToolListSerializer(serializers.Serializer):
    results = ToolSerializer(many=True)


# --- responses and parameters -----------------------------------------------------------------

_ERROR_MEANING = {
    400: "Malformed input (validation, parsing, unstorable text).",
    401: "No token, or a bad one.",
    403: "The caller lacks the right.",
    404: "No such object, or not visible to the caller.",
    406: "The Accept header asks for something other than JSON.",
    409: "The object's state does not allow this now.",
    413: "The body is larger than the server takes.",
    415: "The body is not JSON.",
    422: "The Idempotency-Key was used with another body, or the operation's key with other "
    "parameters.",
    429: "Too many requests (rate_limited: the token's pace, or too many failed attempts from "
    "this address or for this account; queue_full: a proposal's tool has no room); the "
    "Retry-After header says how many seconds to wait.",
}
_READ_ERRORS = (400, 401, 403, 404, 406, 429)
_WRITE_ERRORS = (*_READ_ERRORS, 409, 413, 415, 422)


def responses(ok: dict[int, Any], *, write: bool = False) -> dict[int, Any]:
    """The success bodies given, and the contract's Error for each refusal."""
    documented: dict[int, Any] = dict(ok)
    for status in _WRITE_ERRORS if write else _READ_ERRORS:
        documented[status] = OpenApiResponse(ErrorSerializer, description=_ERROR_MEANING[status])
    return documented


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x21-\\x7e]+$"},
    OpenApiParameter.HEADER,
    description="Replays the first response for the same key and body (API.md).",
)


def limit(default: int, ceiling: int) -> OpenApiParameter:
    return OpenApiParameter(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": ceiling, "default": default},
        description=f"Page size (1-{ceiling}).",
    )


CURSOR = OpenApiParameter(
    "cursor",
    {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[A-Za-z0-9_-]+$"},
    description="The `next` of the previous page.",
)
EVENT_CURSOR = OpenApiParameter(
    "after",
    {"type": "string", "pattern": "^[0-9]{1,18}$"},
    description="An event id: the events strictly after it (from the start without one).",
)
TASK_FILTERS = [
    OpenApiParameter("condition", str, enum=list(TaskCondition.ALL)),
    OpenApiParameter("outcome", str, enum=list(TaskOutcome.ALL)),
    OpenApiParameter(
        "q",
        {"type": "string", "maxLength": 300},
        description="Tasks whose name contains this text, or that own what it names exactly (the "
        "task's id or external_id, an operation's id or key, an approval's id).",
    ),
    OpenApiParameter(
        "external_id",
        {"type": "string", "maxLength": 200},
        description="The task created under this key (at most one of an owner's).",
    ),
    OpenApiParameter(
        "schedule",
        {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
        description="The tasks this schedule started.",
    ),
    CURSOR,
    limit(50, 200),
]
OPERATION_FILTERS = [
    OpenApiParameter("status", str, enum=list(OperationStatus.ALL)),
    OpenApiParameter("task", {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}),
    CURSOR,
    limit(50, 200),
]
RESOLUTIONS = list(resolutions.RESOLUTIONS)
_ID = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}
APPROVAL_FILTERS = [
    OpenApiParameter("status", str, enum=list(ApprovalStatus.ALL)),
    OpenApiParameter("tool", {"type": "string", "maxLength": 200}),
    OpenApiParameter("task", _ID),
    limit(100, 500),
]
WAIT_FILTERS = [
    OpenApiParameter(
        "status",
        {"type": "string", "enum": ["expired"], "default": "expired"},
        description="Only expired waits are listed.",
    ),
    limit(100, 500),
]


# --- outcomes (artifacts, checks, provenance) ----------------------------------------------


class ArtifactSerializer(serializers.Serializer):
    id = serializers.CharField()
    task = serializers.CharField()
    name = serializers.CharField()
    media_type = serializers.CharField()
    digest = serializers.CharField(allow_null=True)
    size = serializers.IntegerField(allow_null=True)
    status = serializers.CharField()
    status_reason = serializers.CharField(allow_null=True)
    verification = serializers.CharField(allow_null=True)
    operation = serializers.CharField(allow_null=True)
    attempt = serializers.CharField(allow_null=True)
    execution = serializers.CharField(allow_null=True)
    code_version = serializers.CharField(allow_null=True)
    input_digests = serializers.JSONField()
    created_by = serializers.CharField(allow_null=True)
    accepted_by = serializers.CharField(allow_null=True)
    accepted_state_version = serializers.IntegerField(allow_null=True)
    accepted_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField(allow_null=True)
    content = serializers.CharField()
    provenance = serializers.CharField()


class ArtifactListSerializer(serializers.Serializer):
    artifacts = ArtifactSerializer(many=True)


class CheckSerializer(serializers.Serializer):
    name = serializers.CharField()
    checker = serializers.CharField()
    checker_version = serializers.CharField(allow_null=True)
    subject = serializers.CharField(allow_null=True)
    subject_digest = serializers.CharField(allow_null=True)
    task_state_version = serializers.IntegerField(allow_null=True)
    result = serializers.ChoiceField(
        choices=["passed", "failed", "unavailable", "timed_out"], allow_null=True
    )
    reason = serializers.CharField(allow_null=True)
    stale = serializers.BooleanField()
    counts = serializers.BooleanField()
    pending_operation = serializers.CharField(allow_null=True)
    at = serializers.DateTimeField(allow_null=True)


class CheckListSerializer(serializers.Serializer):
    checks = CheckSerializer(many=True)


class ProvenanceSerializer(serializers.Serializer):
    """An in-toto Statement v1 with a SLSA v1 provenance predicate."""

    _type = serializers.CharField()
    subject = serializers.ListField(child=serializers.DictField())
    predicateType = serializers.CharField()
    predicate = serializers.DictField()


# --- request bodies whose required fields depend on another field ---------------------------
# Each parsing serializer stays one serializer (console.api.serializers, console.api.humans);
# the schema describes it as exactly one of its shapes, each a named component with its own
# required fields, so a client (and schemathesis) sees what the services refuse with 400.


def one_of(
    target: type[serializers.Serializer],
    *shapes: type[serializers.Serializer],
    description: str,
) -> None:
    """Describe the request serializer ``target`` as ``oneOf`` the ``shapes`` (no discriminator:
    the field that tells them apart may have a default, and a discriminator's may not)."""

    class OneOf(OpenApiSerializerExtension):
        target_class = target

        def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
            refs = [auto_schema.resolve_serializer(shape, direction).ref for shape in shapes]
            # What every shape requires, said once more here: it marks the body required.
            common = set.intersection(
                *({n for n, f in s().fields.items() if f.required} for s in shapes)
            )
            return {"oneOf": refs, "required": sorted(common), "description": description}


class ToolOperationIn(api.OperationIn):
    """A tool call: ``tool`` names a registered tool (400 ``unknown_tool`` otherwise)."""

    kind = serializers.ChoiceField(
        choices=[Operation.KIND_TOOL], required=False, default=Operation.KIND_TOOL
    )
    tool = api.Text(min_length=1, max_length=200)


class WaitSignalOperationIn(api.OperationIn):
    """A durable wait for the signal named ``signal`` (at most ``timeout_seconds``, a day by
    default). Kept by the runtime: no tool, and executor ``worker`` (400 otherwise)."""

    kind = serializers.ChoiceField(choices=[Operation.KIND_WAIT_SIGNAL])
    tool = None  # type: ignore[assignment]  # (DRF drops a parent's field set to None)
    signal = api.Text(min_length=1, max_length=200)


class TimerOperationIn(api.OperationIn):
    """A timer that fires after ``timeout_seconds``. Kept by the runtime: no tool, and executor
    ``worker`` (400 otherwise)."""

    kind = serializers.ChoiceField(choices=[Operation.KIND_TIMER])
    tool = None  # type: ignore[assignment]  # (DRF drops a parent's field set to None)
    timeout_seconds = api.Int(min_value=1, max_value=MAX_WAIT_SECONDS)


one_of(
    api.OperationIn,
    ToolOperationIn,
    WaitSignalOperationIn,
    TimerOperationIn,
    description="A tool call (kind tool, the default) needs tool; a wait_signal needs signal; "
    "a timer needs timeout_seconds. Without them the answer is 400.",
)


@extend_schema_field(OpenApiTypes.BINARY)
class FilePart(serializers.FileField):
    """A file part of a multipart body (binary; DRF's own FileField is described as a URI)."""


class ArtifactUploadIn(serializers.Serializer):
    """The multipart form of an upload (API.md "Artifacts")."""

    file = FilePart(help_text="The content (at most ARTIFACT_MAX_BYTES: 413).")
    name = api.Text(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="The artifact's name; the file's own by default.",
    )
    media_type = api.Text(
        required=False,
        allow_blank=True,
        help_text="The file part's type by default; one of ARTIFACT_MEDIA_TYPES (415 otherwise).",
    )
    operation = api.Text(
        required=False, allow_blank=True, help_text="The operation of this task that made it."
    )
    inputs = api.Text(
        required=False,
        allow_blank=True,
        help_text="Comma-separated ids of this task's artifacts it was made from.",
    )
    input_digests = api.Text(
        required=False,
        allow_blank=True,
        help_text="Comma-separated other inputs, each sha256:<64 hex digits>.",
    )
