"""Outcomes over REST (API.md "Tasks" completion and checks, "Artifacts"): thin views that parse,
call one runtime service and serialise."""

from __future__ import annotations

import base64
from typing import Any

from django.conf import settings
from django.http import FileResponse
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import parsers, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import schema as doc
from console.api.auth import actor_of
from console.api.idempotency import idempotent
from console.api.parsers import text_problem
from console.api.serializers import Int, iso, parse
from console.api.views import ApiView, task_body
from runtime import checks, completion
from runtime.artifacts import UploadSpec, artifact_accept, artifact_upload
from runtime.errors import InvalidInput, PayloadTooLarge
from runtime.models import Artifact, CheckResult
from runtime.selectors.artifacts import (
    artifact_content,
    artifact_get,
    artifact_list,
    provenance_statement,
    verification_of,
)

# Shown inline (preview) on request; everything else is always an attachment.
INLINE_TYPES = (
    "text/plain",
    "application/json",
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
)


def artifact_out(artifact: Artifact, verification: str | None = None) -> dict[str, Any]:
    return {
        "id": artifact.pk,
        "task": artifact.task_id,
        "name": artifact.name,
        "media_type": artifact.media_type,
        "digest": artifact.digest or None,
        "size": artifact.size,
        "status": artifact.status,
        "status_reason": artifact.status_reason or None,
        "verification": verification,
        "operation": artifact.operation_id,
        "attempt": artifact.attempt_id,
        "execution": artifact.execution_id,
        "code_version": artifact.code_version,
        "input_digests": artifact.input_digests,
        "created_by": artifact.created_by or None,
        "accepted_by": artifact.accepted_by or None,
        "accepted_state_version": artifact.accepted_state_version,
        "accepted_at": iso(artifact.accepted_at),
        "created_at": iso(artifact.created_at),
        "content": f"/api/v1/artifacts/{artifact.pk}/content",
        "provenance": f"/api/v1/artifacts/{artifact.pk}/provenance",
    }


def check_out(state: checks.CheckState) -> dict[str, Any]:
    row: CheckResult | None = state.latest
    return {
        "name": state.name,
        "checker": state.checker,
        "checker_version": row.checker_version if row else None,
        "subject": row.subject_id if row else None,
        "subject_digest": (row.subject_digest or None) if row else None,
        "task_state_version": row.task_state_version if row else None,
        "result": row.result if row else None,
        "reason": (row.reason or None) if row else None,
        "stale": bool(row and (row.stale or (row.result == "passed" and not state.counts))),
        "counts": state.counts,
        "pending_operation": state.pending_operation,
        "at": iso(row.at) if row else None,
    }


class CompleteTaskIn(serializers.Serializer):
    if_unresolved = serializers.ChoiceField(
        choices=completion.IF_UNRESOLVED, required=False, default="refuse"
    )


class TaskComplete(ApiView):
    # Not inside the request's transaction: completion runs the checks first, and checkers
    # read storage. Completing again is harmless (a succeeded task is returned unchanged).
    @extend_schema(
        request=CompleteTaskIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.TaskSerializer}, write=True),
    )
    @idempotent(atomic=False)
    def post(self, request: Request, task_id: str) -> Response:
        data = parse(CompleteTaskIn, request.data or {})
        task = completion.task_complete(
            actor_of(request), task_id, if_unresolved=data["if_unresolved"]
        )
        return Response(task_body(task))


class TaskChecks(ApiView):
    @extend_schema(
        operation_id="v1_tasks_checks_list",
        responses=doc.responses({200: doc.CheckListSerializer}),
    )
    def get(self, request: Request, task_id: str) -> Response:
        states = checks.task_checks(actor_of(request), task_id)
        return Response({"checks": [check_out(s) for s in states]})

    @extend_schema(
        operation_id="v1_tasks_checks_run",
        request=None,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.CheckListSerializer}, write=True),
    )
    @idempotent(atomic=False)
    def post(self, request: Request, task_id: str) -> Response:
        """Run the task's required checks now on its current artifacts."""
        states = checks.task_checks_run(actor_of(request), task_id)
        return Response({"checks": [check_out(s) for s in states]})


class TaskArtifacts(ApiView):
    parser_classes = [parsers.MultiPartParser]  # type: ignore[list-item]

    @extend_schema(
        operation_id="v1_tasks_artifacts_list",
        responses=doc.responses({200: doc.ArtifactListSerializer}),
    )
    def get(self, request: Request, task_id: str) -> Response:
        rows = artifact_list(actor_of(request), task_id)
        history = checks.check_history(actor_of(request), task_id)
        return Response({"artifacts": [artifact_out(a, verification_of(a, history)) for a in rows]})

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        # Refuse an oversized body before anything reads it (the multipart parser would spool
        # it to disk first).
        raw = str(request.META.get("CONTENT_LENGTH") or "0")
        declared = int(raw) if raw.isdigit() else 0
        if request.method == "POST" and declared > settings.ARTIFACT_MAX_BYTES + 64 * 1024:
            raise PayloadTooLarge(
                f"the artifact is larger than {settings.ARTIFACT_MAX_BYTES} bytes"
            )

    # Not inside the request's transaction: the bytes go to storage between the stage commits.
    @extend_schema(
        operation_id="v1_tasks_artifacts_upload",
        request={"multipart/form-data": doc.ArtifactUploadIn},
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({201: doc.ArtifactSerializer}, write=True),
    )
    @idempotent(atomic=False)
    def post(self, request: Request, task_id: str) -> Response:
        upload = request.FILES.get("file")
        if upload is None:
            raise InvalidInput("file is required (multipart/form-data)")
        fields = {}
        for field in ("name", "media_type", "operation", "inputs", "input_digests"):
            value = request.data.get(field)
            if value is not None and not isinstance(value, str):
                raise InvalidInput(f"{field} must be text")
            problem = text_problem(value or "")
            if problem:
                raise InvalidInput(f"{field}: {problem}")
            fields[field] = value or ""
        spec = UploadSpec(
            name=fields["name"] or (upload.name or ""),
            media_type=fields["media_type"] or (upload.content_type or ""),
            operation_id=fields["operation"] or None,
            inputs=_split(fields["inputs"]),
            input_digests=_split(fields["input_digests"]),
        )
        artifact = artifact_upload(actor_of(request), task_id, spec, upload)
        return Response(artifact_out(artifact, "unverified"), status=201)


def _split(raw: str) -> list[str]:
    return [p.strip() for p in raw.split(",") if p.strip()]


class AcceptIn(serializers.Serializer):
    expected_state_version = Int(min_value=1)


class ArtifactDetail(ApiView):
    @extend_schema(responses=doc.responses({200: doc.ArtifactSerializer}))
    def get(self, request: Request, artifact_id: str) -> Response:
        artifact = artifact_get(actor_of(request), artifact_id)
        history = checks.check_history(actor_of(request), artifact.task_id)
        return Response(artifact_out(artifact, verification_of(artifact, history)))


class ArtifactAccept(ApiView):
    @extend_schema(
        request=AcceptIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.ArtifactSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, artifact_id: str) -> Response:
        data = parse(AcceptIn, request.data)
        artifact = artifact_accept(
            actor_of(request), artifact_id, expected_state_version=data["expected_state_version"]
        )
        body = artifact_out(artifact)
        body["task_state_version"] = artifact.accepted_state_version
        return Response(body)


class ArtifactContent(ApiView):
    @extend_schema(
        parameters=[OpenApiParameter("inline", bool)],
        responses={
            **doc.responses({}),
            # Served with the artifact's own media type (one of ARTIFACT_MEDIA_TYPES).
            (200, "*/*"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="The bytes, with the media type the artifact was stored with.",
            ),
        },
    )
    def get(self, request: Request, artifact_id: str) -> FileResponse:
        artifact, stream = artifact_content(actor_of(request), artifact_id)
        # "1" (the console's links) or a boolean as generated clients send it.
        inline = (
            request.query_params.get("inline") in ("1", "true")
            and artifact.media_type in INLINE_TYPES
        )
        response = FileResponse(stream, content_type=artifact.media_type)
        response["Content-Length"] = str(artifact.size or 0)
        response["Content-Disposition"] = (
            content_disposition_header(not inline, artifact.name) or ""
        )
        response["ETag"] = f'"{artifact.digest}"'
        response["Digest"] = f"sha-256={_b64(artifact.digest)}"
        # Uploaded bytes never run as a page of this site.
        response["Content-Security-Policy"] = "sandbox; default-src 'none'; img-src 'self'"
        response["X-Content-Type-Options"] = "nosniff"
        return response


def _b64(digest: str) -> str:

    return base64.b64encode(bytes.fromhex(digest.split(":", 1)[1])).decode()


class ArtifactProvenance(ApiView):
    @extend_schema(responses=doc.responses({200: doc.ProvenanceSerializer}))
    def get(self, request: Request, artifact_id: str) -> Response:
        artifact = artifact_get(actor_of(request), artifact_id)
        response = Response(provenance_statement(artifact))
        if request.query_params.get("download") == "1":
            response["Content-Disposition"] = (
                content_disposition_header(True, f"{artifact.name}.intoto.json") or ""
            )
        return response
