"""Named crash points (DBOS's debug triggers): places on the hot path where a test stops one
thread exactly inside a window ("read but not yet written", "row locked, task not yet touched",
"committed but not acknowledged"), so races are hit deterministically instead of by sleeps.

In production nothing is installed and ``crash_point`` is one dictionary lookup. Tests install
an action with ``crash_point_installed``; the action runs in whichever thread reaches the point
(it decides itself whether to block, raise or pass).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

# The points the runtime names, so a test cannot install an action on a misspelt one.
POINTS = frozenset(
    {
        "operation.updated",  # the operation row is updated (locked); the task not yet touched
        "claim.after_read",  # the claim read the operation and its task, nothing locked yet
        "report.before_commit",  # the acceptance is written, not yet committed
        "sweep.after_read",  # the sweeper read an expired lease, not yet taken it over
        "resolve.after_lookup",  # a lookup resolution asked the receiver, no transaction open
        "cancel.after_lock",  # cancel/fail locked the task's live operations, not yet the task
        "artifact.after_put",  # an upload wrote its bytes, not yet read them back
        "artifact.accept_before_commit",  # an acceptance bumped the task's version, uncommitted
        "approval.gate_locked",  # the release gate holds the operation and approval rows
        "approval.before_commit",  # a decision is written, not yet committed
        "approval.expire_locked",  # the expiry sweep holds the operation and approval rows
        "wait.attempt_read",  # a wait's proposal read the task's attempt, nothing written yet
        "wait.before_register",  # a wait's row is inserted, the task row not yet locked
        "wait.registered",  # a wait is registered under the task lock, not yet committed
        "signal.task_locked",  # a signal holds the task row, before looking for a late wait
        "control.applied",  # a pause/resume/steer is written under the task lock, not committed
        "claim.approval_released",  # a gated claim released its approval, not yet moved the op
        "artifact.before_link",  # bytes written under a private name, not yet under their key
        "artifact.awaiting_deletion",  # an upload waits for the reconciler to delete its bytes
        "reconcile.before_delete",  # the reconciler committed its decision, not yet deleted
        "claim.batch_before_commit",  # a batch claim is written, not yet committed
        "drain.after_claim",  # a drainer's batch claim committed, no call made yet
        "drain.leaving",  # a drainer found its list empty, still registered
        "handover.accepted",  # a hand-over accepted its call, not yet claimed the next one
        "report.batch_before_commit",  # a batch's acceptance is written, not yet committed
        "report.after_read",  # the general acceptance read the operation, nothing locked yet
        "resolve.before_lock",  # a resolution passed its checks, its transaction not yet begun
        "rest.after_read",  # a task's rest read the task (under its lock), not yet moved it
        "attempt.before_commit",  # a new attempt is written under the task lock, uncommitted
        "complete.before_commit",  # a completion (and a child's settlement) written, uncommitted
        "admission.counted",  # a proposal counted its class's waiting work under the slot lock
        "claim.slot_counted",  # a claim counted its class's running work under the slot lock
        "schedule.slot_read",  # a sweeper read a schedule's due slot, nothing claimed yet
        "schedule.slot_claimed",  # a slot's row is inserted (claimed), not yet committed
        "schedule.owner_checked",  # a sweeper read, under the schedule's lock, that its owner
        #   can act, and has not yet decided the slot
        "token.revoked",  # a revocation is written (its agent's schedules paused if it was the
        #   last live token), not yet committed
        "stream.user_read",  # a stream's recheck read its person's account, not yet the roles
        "task_key.after_lookup",  # a creation under an external_id found no task, not yet inserted
        "retention.archived",  # retention wrote a batch's archive, nothing locked or removed yet
        "retention.locked",  # retention locked a batch's rows, not yet checked them again
        "worklist.unheld",  # a take found nobody holding its item, not yet inserted its claim
    }
)

_actions: dict[str, Callable[[], None]] = {}


def crash_point(name: str) -> None:
    action = _actions.get(name)
    if action is not None:
        action()


@contextmanager
def crash_point_installed(name: str, action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` whenever a thread of this process reaches ``name`` (tests only)."""
    if name not in POINTS:
        raise ValueError(f"no crash point named {name!r}")
    _actions[name] = action
    try:
        yield
    finally:
        _actions.pop(name, None)


def install_crash_action(name: str, action: Callable[[], None]) -> None:
    """Install ``action`` at ``name`` for the rest of this process's life: for a demo fault
    that ends the process there (runtime.tools.faults), so nothing is left to uninstall."""
    if name not in POINTS:
        raise ValueError(f"no crash point named {name!r}")
    _actions[name] = action
