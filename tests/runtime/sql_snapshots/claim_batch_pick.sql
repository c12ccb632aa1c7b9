WITH pick AS (
  SELECT o.id, o.status AS from_status FROM runtime_operation o
    JOIN runtime_task t ON t.id = o.task_id
  WHERE o.id = ANY(%(ids)b::varchar[])
    AND (o.status IN ('pending', 'retry_scheduled')) IS TRUE
    AND o.executor = %(executor)s
    AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= %(now)s)
    AND t.cancellation = 'none' AND t.condition <> 'terminal'
    AND NOT t.paused
    AND (COALESCE(o.deadline, t.deadline) IS NULL OR COALESCE(o.deadline, t.deadline) > %(now)s)
    AND (%(executor)s <> 'worker' OR (o.tool || ':' || o.tool_version) = ANY(%(tools)b))
    AND o.attempts_used < o.max_attempts
    AND NOT o.approval_required
    AND (o.compensates_id IS NULL) IS TRUE
    AND t.budget = '{}'::jsonb
  ORDER BY o.id
  FOR UPDATE OF o SKIP LOCKED
), op AS (
  UPDATE runtime_operation o SET
    status = 'running',
    state_version = o.state_version + 1,
    lease_generation = o.lease_generation + 1,
    lease_expires_at = statement_timestamp() + make_interval(secs => %(lease_seconds)s::float8),
    lease_token_digest = %(digest)s,
    execution_id = %(execution)s,
    attempts_used = o.attempts_used + 1,
    first_attempt_at = COALESCE(o.first_attempt_at, %(now)s),
    next_attempt_at = NULL,
    status_reason = '',
    cancel_requested = false,
    updated_at = %(now)s
  FROM pick WHERE o.id = pick.id AND (o.status IN ('pending', 'retry_scheduled')) IS TRUE
  RETURNING o.id, o.task_id, o.attempt_id, o.kind, o.tool, o.tool_version, o.step, o.intent_version,
    o.params, o.params_hash, o.idempotency_key, o.executor, o.status, o.state_version,
    o.lease_generation, o.lease_expires_at, o.lease_token_digest, o.execution_id,
    o.attempts_used, o.max_attempts, o.first_attempt_at, o.next_attempt_at, o.deadline,
    o.cancel_requested, o.estimate, o.signal, o.timeout_seconds, o.wait_until,
    o.approval_required, o.result, o.error, o.status_reason, o.compensates_id, o.created_at,
    o.updated_at, pick.from_status
)
SELECT op.id, op.task_id, op.attempt_id, op.kind, op.tool, op.tool_version, op.step,
  op.intent_version, op.params, op.params_hash, op.idempotency_key, op.executor, op.status,
  op.state_version, op.lease_generation, op.lease_expires_at, op.lease_token_digest,
  op.execution_id, op.attempts_used, op.max_attempts, op.first_attempt_at,
  op.next_attempt_at, op.deadline, op.cancel_requested, op.estimate, op.signal,
  op.timeout_seconds, op.wait_until, op.approval_required, op.result, op.error,
  op.status_reason, op.compensates_id, op.created_at, op.updated_at,
  t.cancellation, t.condition, t.paused, op.from_status
FROM op JOIN runtime_task t ON t.id = op.task_id
ORDER BY t.id, op.id
FOR UPDATE OF t
