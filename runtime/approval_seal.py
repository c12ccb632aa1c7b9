"""Approval seals: a keyed MAC over what a person decided, checked at release.

The parameter hash on an approval detects an accidental change, not a deliberate one: whoever
can UPDATE the operation's parameters or the approval row can write a matching hash too. So an
approve writes ``seal = <key id>.<HMAC-SHA256(key, message)>`` under the first key of
``APPROVAL_SEAL_KEYS`` (runtime.keyring; unset, derived from SECRET_KEY under this module's
domain tag), where the message is the canonical JSON of: the approval's id, its operation, its
parameter hash and proposal version, the approver (``decider_key``), the decision, the end of
its validity (``expires_at``, in microseconds), and the canonical hashes of the parameters the
operation holds and of the copy the approver was shown, both as read back from the database.
The release recheck (runtime.approval_gate) computes the same message from the rows it holds and
refuses on any difference: a parameter or a binding edited behind the application's back.

The two-person rule: the seal also covers how many approvers the approval requires and who
voted (the approver keys of its ApprovalVote rows, sorted), so a vote row added, dropped or
rewritten, or a count lowered, after the approval was sealed fails it; the gate then asks each
voter's right on the rows the seal vouched for. A one-approver approval whose one vote is its
decider's keeps the message of ``approval-seal/1`` exactly (seals written before the rule
verify unchanged); any other is ``approval-seal/2`` with the count and the voters appended, so a
sealed two-person approval cannot be passed off as a one-person one (its MAC is over the other
form).

Rotation: the first key seals, every listed key verifies. Add the new key first; keep the old
one while approvals it sealed may still be released or retried (at most the longest validity,
30 days, plus the retries of released work). A seal whose key was dropped is refused and its
action goes to a person, who decides again (and that decision is sealed with the new key).
Seals are not re-sealed on rotation: re-sealing would bless whatever the rows hold at that
moment, which is exactly what the seal must not trust."""

from __future__ import annotations

import base64
import hmac
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from hashlib import sha256
from typing import Any

from runtime.hashing import canonical_json, params_hash
from runtime.keyring import key_id, keyring

# The domain tag of the seal keys: never the lease tokens' keys.
_DOMAIN = b"runtime.approval-seal-key"
_VERSION = "approval-seal/1"
_VERSION_VOTES = "approval-seal/2"
# A seal covers an approval only: a denial releases nothing, so it needs none.
DECISION = "approve"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _micros(at: datetime) -> int:
    # Exact and zone-free: the database keeps microseconds, and both ends read it back.
    return (at - _EPOCH) // timedelta(microseconds=1)


def _message(
    approval: Any, *, approver: str, operation_params: Any, voters: Sequence[str] | None
) -> bytes:
    # A JSON array, so no part can run into the next (unlike joined strings). A row of a
    # migration's model from before the rule (0014) has no count: it had one approver.
    required = int(getattr(approval, "approvals_required", 1))
    voters = [approver] if voters is None else voters
    one = required == 1 and list(voters) == [approver]
    return canonical_json(
        [
            _VERSION if one else _VERSION_VOTES,
            str(approval.pk),
            str(approval.operation_id),
            approval.params_hash,
            int(approval.proposal_version),
            approver,
            DECISION,
            _micros(approval.expires_at),
            params_hash(operation_params),
            params_hash(approval.params),
        ]
        + ([] if one else [required, sorted(voters)])
    ).encode()


def _mac(key: bytes, message: bytes) -> str:
    return base64.urlsafe_b64encode(hmac.new(key, message, sha256).digest()).decode().rstrip("=")


def approval_seal(
    approval: Any, *, approver: str, operation_params: Any, voters: Sequence[str] | None = None
) -> str:
    """The seal of ``approval`` approved by ``approver`` (an actor key, the last voter) over
    ``operation_params`` (the operation's parameters as stored) and ``voters`` (the keys of every
    vote, the approver's included; None: the approver's alone). Preconditions: the approval's
    and the operation's rows were read back from the database (the seal is checked against what
    it reads back), and the approval's other fields are as they will be stored."""
    key = keyring("APPROVAL_SEAL_KEYS", _DOMAIN)[0]
    message = _message(
        approval, approver=approver, operation_params=operation_params, voters=voters
    )
    return f"{key_id(key, _DOMAIN)}.{_mac(key, message)}"


def approval_seal_refusal(approval: Any, operation: Any, voters: Sequence[str]) -> str | None:
    """Why the approved ``approval`` does not hold for ``operation`` and the votes ``voters``
    (approver keys) as the rows are stored now (None: its seal verifies). Reads nothing."""
    if operation.params_hash != approval.params_hash:
        return "the operation's parameter hash is not the approved one"
    if params_hash(operation.params) != params_hash(approval.params):
        return "the operation's parameters are not the ones approved"
    seal = approval.seal or ""
    sealer, dot, mac = seal.partition(".")
    if not dot:
        return "the approval carries no seal"
    keys = {key_id(k, _DOMAIN): k for k in keyring("APPROVAL_SEAL_KEYS", _DOMAIN)}
    key = keys.get(sealer)
    if key is None:
        return "the approval was sealed with a key no longer configured (APPROVAL_SEAL_KEYS)"
    message = _message(
        approval, approver=approval.decider_key, operation_params=operation.params, voters=voters
    )
    if not hmac.compare_digest(mac, _mac(key, message)):
        return "the approval does not match what was decided (its seal does not verify)"
    return None
