"""The sandbox's demo tools. Each reaches a simulated receiver (runtime.sandbox) that keeps its own
records; the fault knobs of runtime.tools.faults strike around the receiver's commit."""

from __future__ import annotations

import time
from typing import Any

from runtime.budgets import MAX_AMOUNT
from runtime.errors import InvalidInput
from runtime.keys import key_notification
from runtime.sandbox import receivers
from runtime.slots import connection_release
from runtime.tools import faults
from runtime.tools.base import (
    Contract,
    InvocationContext,
    ToolAdapter,
    ToolFailure,
    ToolResult,
    register,
)

APPROVAL_THRESHOLD_CENTS = 10000
# Above this a charge needs two distinct approvers (the two-person rule).
TWO_APPROVERS_CENTS = 100000
# The receivers keep amounts in bigint and quantities in integer columns: a larger number is
# refused at proposal, naming the field, instead of approved and then failing in the worker.
MAX_QTY = 2**31 - 1

# The sandbox's knobs, accepted by every demo tool (API.md, "Demo tools"): faults strike around
# the receiver's commit (runtime.tools.faults), work takes time, usage is what the call reports.
_KNOBS: dict[str, Any] = {
    "_fault": {
        "description": "Injected fault: transient:N, or one of the named knobs.",
        "anyOf": [
            {"type": "null"},
            {"type": "string", "enum": ["", *faults.KNOBS]},
            {"type": "string", "pattern": "^transient:[0-9]{1,9}$"},
        ],
    },
    "_work_seconds": {
        "description": "Seconds of simulated work, heartbeating the lease.",
        "type": "number",
        "minimum": 0,
        "maximum": faults.MAX_WORK_SECONDS,
    },
}
_USAGE: dict[str, Any] = {
    "_usage": {
        "description": "What the call reports it consumed: {meter: amount}.",
        "type": ["object", "null"],
        "additionalProperties": {"type": "number", "minimum": 0, "maximum": MAX_AMOUNT},
    }
}


def _schema(
    properties: dict[str, Any], required: tuple[str, ...] = (), *, usage: bool = False
) -> dict[str, Any]:
    """A demo tool's params schema: its own fields, the knobs, other keys allowed (a receiver
    ignores what it does not know)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {**properties, **_KNOBS, **(_USAGE if usage else {})},
        "required": list(required),
    }


_TEXT = {"type": "string", "minLength": 1}


def _effective(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if not k.startswith("_")}


def _outcome(response: receivers.Response, handle_field: str = "id") -> ToolResult:
    """Map a receiver's response to a result or a classified failure."""
    receipt = {"status": response.status, "body": response.body}
    if response.ok:
        return ToolResult(
            result=response.body,
            usage={"tool_calls": 1},
            receipt=receipt,
            provider_handle=str(response.body.get(handle_field, "")),
        )
    error = response.body.get("error", {})
    message = str(error.get("message", response.status))
    if error.get("type") == "stale_fencing_token":
        # A newer lease holder acted under this key: this holder's lease was taken over.
        raise ToolFailure(ToolFailure.PERMANENT, message, receipt=receipt)
    if response.status == 409:  # the receiver is still executing the first request
        raise ToolFailure(ToolFailure.TRANSIENT, message, receipt=receipt)
    raise ToolFailure(ToolFailure.PERMANENT, message, receipt=receipt)


class Echo(ToolAdapter):
    name = "demo.echo"
    description = "Returns its parameters (the knobs left out)."
    contract = Contract.PURE
    demo = True
    quick_calls = True
    params_schema = _schema({}, usage=True)

    def quick(self, params: dict[str, Any]) -> bool:
        # Injected faults and simulated work are exercised one call at a time.
        return not params.get("_fault") and not params.get("_work_seconds")

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        fault = faults.before_effect(ctx)
        faults.work(ctx)
        result = _effective(ctx.params)
        faults.after_effect(ctx, fault)
        return ToolResult(result=result, usage={"tool_calls": 1, **_usage(ctx.params)})


def _usage(params: dict[str, Any]) -> dict[str, float]:
    """``"_usage": {meter: amount}``: what the demo call reports it consumed."""
    raw = params.get("_usage") or {}
    if not isinstance(raw, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= MAX_AMOUNT
        for v in raw.values()
    ):
        raise InvalidInput(
            f"params._usage must map meter names to numbers from 0 to {MAX_AMOUNT}",
            field="params._usage",
        )
    return {str(k): float(v) for k, v in raw.items()}


class Slow(ToolAdapter):
    """A receiver call that takes ``seconds`` and does not listen to cancellation meanwhile
    (it never heartbeats). Its receiver records each call's start and end, and the deadline
    time the caller passed on."""

    name = "demo.slow"
    description = "Takes `seconds` at its receiver without heartbeating, then returns."
    contract = Contract.PURE
    tool_class = "demo.slow"
    demo = True
    params_schema = _schema(
        {"seconds": {"type": "number", "minimum": 0, "maximum": 120, "default": 0}}, usage=True
    )

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        fault = faults.before_effect(ctx)
        receivers.slow_call(
            key=ctx.idempotency_key,
            seconds=float(ctx.params.get("seconds", 0)),
            fencing_token=ctx.fencing_token,
            deadline_remaining=ctx.remaining_seconds(),
        )
        faults.after_effect(ctx, fault)
        return ToolResult(
            result=_effective(ctx.params), usage={"tool_calls": 1, **_usage(ctx.params)}
        )


class SlowWait(ToolAdapter):
    """A call that waits, as a call to a model or an HTTP API does (``io_bound``): a worker
    process makes many side by side, each in a slot (runtime.slots). Its receiver records each
    call's start and end (demo.slow's records). It waits ``seconds``; with ``wait_for`` N, only
    until N calls of its task have started at the receiver (or ``seconds`` passed): a barrier
    that only calls made side by side pass. It holds no database connection while it waits,
    and does not listen to cancellation meanwhile (it never heartbeats)."""

    name = "demo.slow_wait"
    description = (
        "Waits `seconds` at its receiver (or until `wait_for` calls of its task started there), "
        "holding no worker process: calls like it run side by side."
    )
    contract = Contract.PURE
    io_bound = True
    demo = True
    params_schema = _schema(
        {
            "seconds": {"type": "number", "minimum": 0, "maximum": 120, "default": 1},
            "wait_for": {"type": "integer", "minimum": 1, "maximum": 10000},
        },
        usage=True,
    )

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        fault = faults.before_effect(ctx)
        call_id = receivers.slow_wait_start(
            key=ctx.idempotency_key,
            fencing_token=ctx.fencing_token,
            deadline_remaining=ctx.remaining_seconds(),
        )
        connection_release()
        until = time.monotonic() + float(ctx.params.get("seconds", 1))
        wanted = ctx.params.get("wait_for")
        while (left := until - time.monotonic()) > 0:
            if wanted is None:
                time.sleep(left)
                break
            started = receivers.slow_calls_started(ctx.task_id)
            connection_release()
            if started >= int(wanted):
                break
            time.sleep(min(left, 0.1))
        response = receivers.slow_wait_end(call_id)
        faults.after_effect(ctx, fault)
        return ToolResult(
            result={**_effective(ctx.params), "call": response.body["id"]},
            usage={"tool_calls": 1, **_usage(ctx.params)},
        )


class PaymentsCharge(ToolAdapter):
    name = "demo.payments.charge"
    description = "Charges an account (a Stripe-like receiver: the first result per key)."
    contract = Contract.REPLAY
    compensation_tool = "demo.payments.refund"
    demo = True
    approval_when = f"amount_cents above {APPROVAL_THRESHOLD_CENTS}"
    params_schema = _schema(
        {
            "account": _TEXT,
            # The receiver keeps amounts in bigint, and budgets count to MAX_AMOUNT.
            "amount_cents": {"type": "integer", "minimum": 1, "maximum": MAX_AMOUNT},
        },
        ("account", "amount_cents"),
    )

    approvers = 2
    approvers_when = f"amount_cents above {TWO_APPROVERS_CENTS}"

    def requires_approval(self, params: dict[str, Any]) -> bool:
        return int(params.get("amount_cents", 0)) > APPROVAL_THRESHOLD_CENTS

    def approvals_required(self, params: dict[str, Any]) -> int:
        return 2 if int(params.get("amount_cents", 0)) > TWO_APPROVERS_CENTS else 1

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        fault = faults.before_effect(ctx)
        response = receivers.payments_charge(
            key=ctx.idempotency_key, body=_effective(ctx.params), fencing_token=ctx.fencing_token
        )
        faults.after_effect(ctx, fault)
        return _outcome(response)

    def compensation_params(self, result: Any) -> dict[str, Any]:
        return {"charge": result["id"]}


class PaymentsRefund(ToolAdapter):
    name = "demo.payments.refund"
    description = "Refunds a charge (the compensation of demo.payments.charge)."
    contract = Contract.REPLAY
    demo = True
    params_schema = _schema({"charge": {"type": "string"}}, ("charge",))

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        fault = faults.before_effect(ctx)
        faults.work(ctx)
        response = receivers.payments_refund(
            key=ctx.idempotency_key, charge_id=ctx.params["charge"], fencing_token=ctx.fencing_token
        )
        faults.after_effect(ctx, fault)
        return _outcome(response)


class InventoryReserve(ToolAdapter):
    name = "demo.inventory.reserve"
    description = "Reserves stock; the receiver can be asked what happened under a key."
    contract = Contract.LOOKUP
    compensation_tool = "demo.inventory.release"
    demo = True
    params_schema = _schema(
        {"sku": _TEXT, "qty": {"type": "integer", "minimum": 1, "maximum": MAX_QTY}},
        ("sku", "qty"),
    )

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        fault = faults.before_effect(ctx)
        response = receivers.inventory_reserve(
            key=ctx.idempotency_key,
            sku=ctx.params["sku"],
            qty=ctx.params["qty"],
            fencing_token=ctx.fencing_token,
        )
        faults.after_effect(ctx, fault)
        return _outcome(response)

    def lookup(self, ctx: InvocationContext) -> ToolResult | None:
        response = receivers.inventory_lookup(
            key=ctx.idempotency_key, fencing_token=ctx.fencing_token
        )
        if response.status == 404:
            return None
        result = _outcome(response)
        result.receipt = {**(result.receipt or {}), "via": "lookup"}
        return result

    def compensation_params(self, result: Any) -> dict[str, Any]:
        return {"reservation": result["id"]}


class InventoryRelease(ToolAdapter):
    name = "demo.inventory.release"
    description = "Releases a reservation (the compensation of demo.inventory.reserve)."
    contract = Contract.REPLAY  # releasing twice leaves the same state
    demo = True
    params_schema = _schema({"reservation": {"type": "string"}}, ("reservation",))

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        fault = faults.before_effect(ctx)
        faults.work(ctx)
        response = receivers.inventory_release(
            key=ctx.idempotency_key, reservation_id=ctx.params["reservation"]
        )
        faults.after_effect(ctx, fault)
        return _outcome(response)


class Notify(ToolAdapter):
    name = "demo.notify"
    description = "Sends a message; the receiver promises nothing about repeats."
    contract = Contract.NONE
    demo = True
    params_schema = _schema({"to": _TEXT, "message": {"type": "string"}}, ("to",))

    def key_for(
        self,
        task_id: str,
        step: str,
        params: dict[str, Any],
        intent_version: int,
        attempt: int = 1,
    ) -> str:
        return key_notification(
            task_id, step, str(params.get("to", "")), intent_version, attempt=attempt
        )

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        fault = faults.before_effect(ctx)
        response = receivers.notify_send(
            key=ctx.idempotency_key, to=ctx.params["to"], message=ctx.params.get("message", "")
        )
        faults.after_effect(ctx, fault)
        return _outcome(response)


for _adapter in (
    Echo(),
    PaymentsCharge(),
    PaymentsRefund(),
    InventoryReserve(),
    InventoryRelease(),
    Notify(),
    Slow(),
    SlowWait(),
):
    register(_adapter)
