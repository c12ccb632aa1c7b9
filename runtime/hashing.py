"""Canonical JSON and the parameter hash that binds keys, approvals and replays to exact intent."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Sorted keys, no insignificant whitespace, UTF-8 kept: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def params_hash(params: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(params).encode()).hexdigest()
