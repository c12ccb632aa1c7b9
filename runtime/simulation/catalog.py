"""What the simulated world proposes and delivers: its tools and their variants, hostile step
names, required checks and artifacts, the call kinds, each action's fallback, and a worker's
claim as the world holds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.transitions.accept_decision import Report
from runtime.transitions.lease import Lease

# Tools the agents propose: (tool, params, executor); the approval threshold of the payments
# receiver is 10000 cents, so the second charge waits for a person. A notification to
# "demo.echo" and a refund are there for the key domains: before parts were escaped, an echo
# step "notify:x" had the key of a notification "x" to "demo.echo", and a refund step
# "<step>:demo.payments.charge:v1:compensate" the key of that charge's compensation.
TOOLS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("demo.echo", {"n": 1}, "worker"),
    ("demo.payments.charge", {"account": "acct", "amount_cents": 500}, "worker"),
    ("demo.payments.charge", {"account": "acct", "amount_cents": 20000}, "worker"),
    ("demo.inventory.reserve", {"sku": "sku", "qty": 1}, "worker"),
    ("demo.notify", {"to": "ops", "message": "hi"}, "worker"),
    ("demo.echo", {"n": 2, "_usage": {"tokens": 3}}, "worker"),
    ("demo.notify", {"to": "demo.echo", "message": "hi"}, "worker"),
    ("demo.payments.refund", {"charge": "ch_sim"}, "worker"),
    ("demo.echo", {"n": 3}, "agent"),
    ("demo.echo", {"n": 4, "_usage": {"tokens": 2}}, "agent"),
    ("demo.payments.charge", {"account": "declined-sim", "amount_cents": 700}, "worker"),
)
# The charge above the approval threshold (10000 cents): what a person must decide.
GATED_VARIANT = 2
WAIT_VARIANTS = 2  # a signal wait, a timer
# A proposal's variant: an index into TOOLS, or past it a wait. Effects with a contract to
# honour (a small charge, a reservation, a notification) and usage on a meter come up more
# often than the rest: they are where a lost call or a dropped meter shows.
VARIANTS = (*range(len(TOOLS)), 1, 1, 3, 3, 4, 5, 5, 9, 2, len(TOOLS), len(TOOLS) + 1)

# Step names an agent may choose, hostile to keys that join parts with separators: the
# separator itself, the escape character, a namespace separator, a derived key's literal field
# ("notify", "compensate", "check"), an escape sequence spelled out, non-ASCII letters.
HOSTILE_STEPS = (
    "notify:x",
    "x",
    "s",
    "s:demo.payments.charge:v1:compensate",
    "a:b",
    "a%3Ab",
    "x/y ünï·日本",
)
# Variant -> the hostile step that meets another intent's key if parts are not escaped: an echo
# "notify:x" and a notification "x" to "demo.echo"; a refund step spelling the compensation key
# of the charge step "s".
PAIRED_STEPS = {0: "notify:x", 6: "x", 1: "s", 7: "s:demo.payments.charge:v1:compensate"}

# Completion checks a task may require, on its artifact "report.json"; the oracle knows which
# uploaded content satisfies the schema (ARTIFACTS: name, media type, content, valid).
REPORT = "report.json"
SCHEMA = {"type": "object", "required": ["ok"], "properties": {"ok": {"enum": [True]}}}
REQUIRED_CHECKS: tuple[dict[str, Any], ...] = (
    {
        "name": "report-valid",
        "checker": "json_schema",
        "config": {"artifact": REPORT, "schema": SCHEMA},
    },
    {
        "name": "report-op",
        "checker": "operation",
        "config": {"artifact": REPORT, "tool": "check.json_schema", "params": {"schema": SCHEMA}},
    },
    {"name": "notes-present", "checker": "artifact_present", "config": {"artifact": "notes.txt"}},
)
ARTIFACTS: tuple[tuple[str, str, bytes, bool], ...] = (
    (REPORT, "application/json", b'{"ok": true, "n": 1}', True),
    (REPORT, "application/json", b'{"ok": false}', False),
    (REPORT, "application/json", b"not json", False),
    (REPORT, "application/json", b'{"ok": true, "n": 2}', True),
    ("notes.txt", "text/plain", b"notes", True),
)

# What a call does (``variant % 10``): the real receiver (0-4), a transient failure before the
# receiver (5), a permanent refusal (6; a receiver that answers for its key, replay or lookup,
# is asked instead: it refuses for itself, a declined card, or replays what it did), no answer
# before reaching it (7), and the receiver acted but its answer was lost (8, 9).
CALL_KINDS = 10
# An action that found nothing to act on -> the one that makes its subject.
FALLBACK = {
    "report": "call",
    "call": "work",
    "late": "report",
    "stall": "work",
    "heartbeat": "work",
    "takeover": "work",
    "claim": "propose",
    "claim_batch": "propose",
    "work": "propose",
    "decide": "propose",
    "edit": "decide",
    "renew": "expire",
    "resolve": "work",
    "agent_report": "agent_claim",
    "agent_claim": "propose",
    "accept": "deliver",
    "deliver": "upload",
    "wake": "signal",
    "wait_admin": "expire",
    "stop_live": "propose",
    "expire": "tick",
}
# At most this many tasks a run (the world stops creating them): a long run's later steps
# work on the tasks it has.
MAX_TASKS = 400


@dataclass
class Held:
    """A claim a simulated worker holds: claimed, maybe called (its report ready), not reported."""

    worker: int
    lease: Lease
    report: Report | None = None
    reported: bool = False  # accepted, but the response was lost: the worker will report again
    batched: bool = False  # claimed by a batch: reported with the batch's other ready claims
