"""Reminders before expiry (the sweeper): approvals and signal waits about to expire are
noted once per validity period, as events the fan-out reads."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runtime.actors import SWEEPER
from runtime.models import Approval, NotificationEvent, Operation
from runtime.models.notifications import NotificationKind
from runtime.notify_events import notice_txn
from runtime.rules.statuses import ApprovalStatus, OperationStatus

K = NotificationKind


def expiry_notice_sweep(now: datetime | None = None, batch: int = 200) -> int:
    """Note approvals and signal waits that expire within NOTIFY_EXPIRY_WARNING_SECONDS (once
    per validity period: a renewal may be reminded again). Only those that lived past their
    warning point: a request shorter than the threshold was announced when it was made.
    Returns how many were noted now (those noted by an earlier sweep are not again)."""
    now = now or timezone.now()
    ahead = timedelta(seconds=settings.NOTIFY_EXPIRY_WARNING_SECONDS)
    due: list[tuple[str, str, dict[str, Any]]] = []
    for approval in Approval.objects.filter(
        status=ApprovalStatus.PENDING, expires_at__gt=now, expires_at__lte=now + ahead
    ).order_by("expires_at")[:batch]:
        if approval.created_at <= approval.expires_at - ahead:
            due.append(
                (
                    K.APPROVAL_EXPIRING,
                    f"{approval.pk}:{approval.expires_at.isoformat()}",
                    {
                        "task_id": approval.task_id,
                        "approval_id": approval.pk,
                        "operation_id": approval.operation_id,
                        "data": {
                            "expires_at": approval.expires_at.isoformat(),
                            "tool": approval.tool,
                        },
                    },
                )
            )
    for op in Operation.objects.filter(
        status=OperationStatus.WAITING,
        kind=Operation.KIND_WAIT_SIGNAL,
        wait_until__gt=now,
        wait_until__lte=now + ahead,
    ).order_by("wait_until")[:batch]:
        if op.wait_until is not None and op.created_at <= op.wait_until - ahead:
            due.append(
                (
                    K.WAIT_EXPIRING,
                    f"{op.pk}:{op.wait_until.isoformat()}",
                    {
                        "task_id": op.task_id,
                        "operation_id": op.pk,
                        "data": {"expires_at": op.wait_until.isoformat(), "signal": op.signal},
                    },
                )
            )
    if not due:
        return 0
    # Noted by an earlier sweep: not again (and no hint for nothing new).
    seen = set(
        NotificationEvent.objects.filter(
            dedupe__in=[f"{kind}:{dedupe}" for kind, dedupe, _ in due]
        ).values_list("dedupe", flat=True)
    )
    fresh_due = [d for d in due if f"{d[0]}:{d[1]}" not in seen]
    with transaction.atomic():
        for kind, dedupe, fields in fresh_due:
            notice_txn(kind, dedupe, actor=SWEEPER, now=now, **fields)
    return len(fresh_due)
