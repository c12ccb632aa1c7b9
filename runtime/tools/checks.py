"""Check tools: completion checks that run on the workers as ordinary operations (leased,
fenced, retried), for the ``operation`` checker. Each returns ``{"passed": bool, "reason"}``."""

from __future__ import annotations

from typing import Any

from runtime.errors import InvalidInput
from runtime.tools.base import Contract, InvocationContext, ToolAdapter, ToolFailure, ToolResult
from runtime.tools.base import register as register_tool


class JsonSchemaCheck(ToolAdapter):
    """Validates the artifact's bytes (read from storage by digest) against ``schema``."""

    name = "check.json_schema"
    version = "1"
    contract = Contract.PURE
    max_attempts = 3

    def validate(self, params: dict[str, Any]) -> None:
        if not isinstance(params.get("schema"), dict):
            raise InvalidInput("check.json_schema needs params.schema (a JSON Schema object)")

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        from runtime import artifact_store as store
        from runtime.checks import json_schema_verdict

        subject = ctx.params.get("artifact") or {}
        key = str(subject.get("key") or "")
        if not key.startswith(store.PREFIX):
            raise ToolFailure(ToolFailure.PERMANENT, "params.artifact.key is not a content key")
        try:
            result, reason = json_schema_verdict(store.content_chunks(key), ctx.params["schema"])
        except store.ContentMissing:
            raise ToolFailure(
                ToolFailure.PERMANENT, "the artifact's bytes are not stored"
            ) from None
        if result == "unavailable":
            raise ToolFailure(ToolFailure.PERMANENT, reason)
        return ToolResult(
            {"passed": result == "passed", "reason": reason, "digest": subject.get("digest")}
        )


register_tool(JsonSchemaCheck())
