WITH cur AS (
  SELECT t.current_attempt_id = %(attempt_id)s AS same
  FROM runtime_task t WHERE t.id = %(task_id)s FOR NO KEY UPDATE
), op AS (
  INSERT INTO runtime_operation (
    id, task_id, attempt_id, kind, tool, tool_version, step, intent_version, params, params_hash,
    idempotency_key, executor, status, state_version, lease_generation, lease_token_digest,
    attempts_used, max_attempts, deadline, cancel_requested, estimate, signal, timeout_seconds,
    status_reason, approval_required, created_at, updated_at)
  SELECT
    %(id)s, %(task_id)s, %(attempt_id)s, %(kind)s, %(tool)s, %(tool_version)s,
    %(step)s, %(intent_version)s, %(params)s, %(params_hash)s, %(key)s, %(executor)s,
    'pending', 1, 0, '', 0, %(max_attempts)s, %(deadline)s, false, %(estimate)s,
    %(signal)s, %(timeout_seconds)s, '', false, %(now)s, %(now)s
  FROM cur WHERE cur.same
  ON CONFLICT ON CONSTRAINT operation_key_unique_per_task DO NOTHING
  RETURNING id, task_id, state_version
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
      'task_condition', task.condition, 'task_state_version', task.state_version)
  FROM op, task
), announce AS (
  INSERT INTO runtime_outboxmessage
    (topic, operation_id, payload, created_at, available_at, publish_count)
  SELECT 'operation.execute', op.id, %(outbox_payload)s, %(now)s, %(now)s, 0
  FROM op WHERE %(announce)s
  RETURNING id
)
SELECT task.id, task.event_seq, task.condition, task.outcome, task.state_version,
  task.cancellation, task.paused, task.deadline, task.ops_active,
  (SELECT id FROM announce) AS outbox_id,
  CASE
      WHEN task.cancellation <> 'none' THEN runtime_refuse('task_cancelled')
      WHEN task.condition = 'terminal' THEN runtime_refuse('task_terminal')
      WHEN task.paused THEN runtime_refuse('task_paused')
      WHEN %(now)s >= task.deadline THEN runtime_refuse('deadline_exceeded')
      ELSE true END AS admitted
FROM op, task
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM cur WHERE cur.same IS NOT TRUE
