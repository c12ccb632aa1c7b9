WITH prev AS (
  -- The status the claim leaves, for the journal's "from" (as the general path writes it):
  -- read under the row's lock, so it is the version the UPDATE below replaces. Only a row the
  -- claim can take is locked (a duplicate delivery of running work locks nothing, so a batch
  -- claimer's SKIP LOCKED never skips a row for it), and with the UPDATE's own strength: FOR
  -- UPDATE would also block the key-share locks that rows inserted for the operation by
  -- other transactions take (events, invocations).
  SELECT id, status FROM runtime_operation
  WHERE id = %(id)s AND (status IN ('pending', 'retry_scheduled')) IS TRUE
  FOR NO KEY UPDATE
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
  FROM runtime_task t, prev
  WHERE o.id = prev.id AND t.id = o.task_id
    AND (o.status IN ('pending', 'retry_scheduled')) IS TRUE
    AND o.executor = %(executor)s
    AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= %(now)s)
    AND t.cancellation = 'none' AND t.condition <> 'terminal'
    AND NOT t.paused
    AND (COALESCE(o.deadline, t.deadline) IS NULL OR COALESCE(o.deadline, t.deadline) > %(now)s)
    AND (%(executor)s <> 'worker' OR (o.tool || ':' || o.tool_version) = ANY(%(supported)s))
    AND o.attempts_used < o.max_attempts
    AND NOT o.approval_required
    AND (o.compensates_id IS NULL) IS TRUE
    AND (o.attempts_used = 0 OR t.budget = '{}'::jsonb)
  RETURNING o.id, o.task_id, o.attempt_id, o.kind, o.tool, o.tool_version, o.step, o.intent_version,
    o.params, o.params_hash, o.idempotency_key, o.executor, o.status, o.state_version,
    o.lease_generation, o.lease_expires_at, o.lease_token_digest, o.execution_id,
    o.attempts_used, o.max_attempts, o.first_attempt_at, o.next_attempt_at, o.deadline,
    o.cancel_requested, o.estimate, o.signal, o.timeout_seconds, o.wait_until,
    o.approval_required, o.result, o.error, o.status_reason, o.compensates_id, o.created_at,
    o.updated_at,
    t.budget AS task_budget, prev.status AS from_status
), task AS (
  UPDATE runtime_task SET
    event_seq = event_seq + 1,
    ops_active = ops_active + %(d_active)s,
    ops_claimable = ops_claimable + %(d_claimable)s,
    ops_blocked = ops_blocked + %(d_blocked)s,
    state_version = state_version + CASE WHEN condition <> CASE WHEN condition = 'terminal' THEN 'terminal'
      WHEN ops_active + %(d_active)s > 0 THEN 'running'
      WHEN ops_claimable + %(d_claimable)s > 0 THEN 'runnable'
      WHEN ops_blocked + %(d_blocked)s > 0 THEN 'waiting'
      ELSE 'runnable' END
      THEN 1 ELSE 0 END,
    condition = CASE WHEN condition = 'terminal' THEN 'terminal'
      WHEN ops_active + %(d_active)s > 0 THEN 'running'
      WHEN ops_claimable + %(d_claimable)s > 0 THEN 'runnable'
      WHEN ops_blocked + %(d_blocked)s > 0 THEN 'waiting'
      ELSE 'runnable' END,
    updated_at = %(now)s
  WHERE id = (SELECT task_id FROM op)
  RETURNING id, event_seq, condition, outcome, state_version, cancellation, paused, deadline,
    ops_active
), ev AS (
  INSERT INTO runtime_event (task_id, seq, type, at, state_version, operation_id, actor, data)
  SELECT task.id, task.event_seq, %(event_type)s, %(now)s, op.state_version, op.id, %(actor)s,
    %(event_data)s::jsonb || jsonb_build_object(
      'from', op.from_status, 'lease_generation', op.lease_generation,
      'attempt', op.attempts_used) || jsonb_build_object(
      'task_condition', task.condition, 'task_state_version', task.state_version)
  FROM op, task
), inv AS (
  INSERT INTO runtime_invocation
    (operation_id, number, lease_generation, execution_id, started_at, provider_handle)
  SELECT op.id, op.attempts_used, op.lease_generation, %(execution)s, %(now)s, ''
  FROM op
), spent AS (
  DELETE FROM runtime_outboxmessage WHERE operation_id = (SELECT id FROM op)
)
SELECT op.id, op.task_id, op.attempt_id, op.kind, op.tool, op.tool_version, op.step,
  op.intent_version, op.params, op.params_hash, op.idempotency_key, op.executor, op.status,
  op.state_version, op.lease_generation, op.lease_expires_at, op.lease_token_digest,
  op.execution_id, op.attempts_used, op.max_attempts, op.first_attempt_at,
  op.next_attempt_at, op.deadline, op.cancel_requested, op.estimate, op.signal,
  op.timeout_seconds, op.wait_until, op.approval_required, op.result, op.error,
  op.status_reason, op.compensates_id, op.created_at, op.updated_at,
  task.id AS task__id, task.event_seq AS task__event_seq,
    task.condition AS task__condition, task.outcome AS task__outcome,
    task.state_version AS task__state_version, task.cancellation AS task__cancellation,
    task.paused AS task__paused, task.deadline AS task__deadline,
    task.ops_active AS task__ops_active,
  op.task_budget
FROM op, task
