"""Reads (selectors, in HackSoft's sense): functions that only query, one module per entity
(approvals, metrics, operations, waits, ...). They take the caller's actor where visibility
matters, return rows or plain values, and never write or open a transaction of their own; the
services that write live beside them in ``runtime`` and may call them, never the reverse."""
