"""Check tools: completion checks that run on the workers as ordinary operations (leased,
fenced, retried), for the ``operation`` checker. Each returns ``{"passed": bool, "reason"}``."""

from __future__ import annotations

from typing import Any

from runtime import artifact_store as store
from runtime.jsonschemas import json_schema_validate, json_schema_verdict
from runtime.models import Artifact
from runtime.tools.base import Contract, InvocationContext, ToolAdapter, ToolFailure, ToolResult
from runtime.tools.base import register as register_tool


class JsonSchemaCheck(ToolAdapter):
    """Validates the artifact's bytes (read from storage by digest) against ``schema``."""

    name = "check.json_schema"
    description = "Validates an artifact of the task against a JSON Schema (a completion check)."
    version = "1"
    contract = Contract.PURE
    max_attempts = 3
    params_schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "schema": {"type": "object", "description": "A JSON Schema referring only to itself."},
            "artifact": {
                "type": "object",
                "description": "The artifact checked (set by the operation checker).",
                "properties": {"id": {"type": "string"}, "digest": {"type": "string"}},
            },
        },
        "required": ["schema"],
    }

    def check(self, params: dict[str, Any]) -> None:
        # Whether ``schema`` is itself a valid, self-contained JSON Schema is not for a schema.
        json_schema_validate(params["schema"], "params.schema")

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        subject = ctx.params.get("artifact")
        subject = subject if isinstance(subject, dict) else {}
        # The bytes are those of an artifact of this operation's own task, under the key that
        # artifact recorded: params name the artifact, never a storage key or a path (an agent
        # may propose this tool itself, with any params).
        artifact = (
            Artifact.objects.filter(pk=str(subject.get("id") or ""), task_id=ctx.task_id)
            .exclude(storage_key="")
            .first()
        )
        if artifact is None or artifact.digest != subject.get("digest"):
            raise ToolFailure(
                ToolFailure.PERMANENT, "params.artifact is not a stored artifact of this task"
            )
        try:
            result, reason = json_schema_verdict(
                store.content_chunks(artifact.storage_key), ctx.params.get("schema")
            )
        except store.ContentMissing:
            raise ToolFailure(
                ToolFailure.PERMANENT, "the artifact's bytes are not stored"
            ) from None
        if result == "unavailable":
            raise ToolFailure(ToolFailure.PERMANENT, reason)
        return ToolResult(
            {"passed": result == "passed", "reason": reason, "digest": artifact.digest}
        )


register_tool(JsonSchemaCheck())
