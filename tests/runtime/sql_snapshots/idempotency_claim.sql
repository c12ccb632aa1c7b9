SELECT c.taken, (c.existing)."id", (c.existing)."principal", (c.existing)."key", (c.existing)."method",
  (c.existing)."path", (c.existing)."body_hash", (c.existing)."status",
  (c.existing)."response_status", (c.existing)."response_body", (c.existing)."created_at",
  (c.existing)."finished_at"
FROM runtime_idempotency_claim(%s, %s) c
