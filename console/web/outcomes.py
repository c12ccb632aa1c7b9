"""The task page's outcomes section: artifacts (name, digest, size, stage, verification,
provenance, download, a preview for text, JSON and images) and the required checks with their
results. A fragment of its own, re-fetched live on every journal event of the task."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.web.decorators import console_view
from runtime import artifact_store as store
from runtime import checks
from runtime.actors import Actor
from runtime.models import Artifact
from runtime.selectors.artifacts import artifact_list, verification_of

PREVIEW_BYTES = 4096
TEXT_PREVIEW = ("text/plain", "text/markdown", "text/csv", "application/json")
IMAGE_PREVIEW = ("image/png", "image/jpeg", "image/gif", "image/webp")
READABLE = ("stored", "accepted", "superseded")


def _preview(artifact: Artifact) -> dict[str, Any] | None:
    if artifact.status not in READABLE:
        return None
    if artifact.media_type in IMAGE_PREVIEW:
        return {"kind": "image"}
    if artifact.media_type not in TEXT_PREVIEW:
        return None
    try:
        head = b""
        for chunk in store.content_chunks(artifact.storage_key, chunk_size=PREVIEW_BYTES):
            head = chunk[:PREVIEW_BYTES]
            break
    except Exception:
        return {"kind": "missing"}
    text = head.decode("utf-8", errors="replace")
    return {"kind": "text", "text": text, "cut": (artifact.size or 0) > len(head)}


def outcomes_context(actor: Actor, task_id: str) -> dict[str, Any]:
    rows = artifact_list(actor, task_id)
    history = checks.check_history(actor, task_id)
    return {
        "task_id": task_id,
        "artifacts": [
            {
                "a": a,
                "verification": verification_of(a, history),
                "preview": _preview(a),
                "inputs": a.input_digests,
            }
            for a in rows
        ],
        "checks": checks.task_checks(actor, task_id),
    }


@require_GET
@console_view
def task_outcomes_fragment(request: HttpRequest, actor: Actor, task_id: str) -> HttpResponse:
    return render(request, "console/_task_outcomes.html", outcomes_context(actor, task_id))
