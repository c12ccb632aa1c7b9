WITH op AS (
  UPDATE runtime_operation o SET
    status = %(target)s,
    state_version = o.state_version + 1,
    result = %(result)s,
    error = %(error)s,
    next_attempt_at = %(next_at)s,
    lease_expires_at = NULL,
    updated_at = %(now)s
  WHERE o.id = %(id)s AND (o.status = 'running') IS TRUE
    AND o.lease_generation = %(generation)s AND o.state_version = %(state_version)s
    AND o.lease_token_digest = %(digest)s AND (o.compensates_id IS NULL) IS TRUE
    AND EXISTS (
      SELECT 1 FROM runtime_task t WHERE t.id = o.task_id AND t.cancellation = 'none' AND t.condition <> 'terminal')
  RETURNING o.id, o.task_id, o.state_version
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
), inv AS (
  UPDATE runtime_invocation SET outcome = %(inv_outcome)s, finished_at = %(now)s,
    receipt = %(receipt)s, provider_handle = %(handle)s
  WHERE operation_id = (SELECT id FROM op) AND lease_generation = %(generation)s
), announce AS (
  INSERT INTO runtime_outboxmessage
    (topic, operation_id, payload, created_at, available_at, publish_count)
  SELECT 'operation.execute', op.id, %(outbox_payload)s, %(now)s, %(next_at)s, 0
  FROM op WHERE %(announce)s
  RETURNING id
)
SELECT task.id, task.event_seq, task.condition, task.outcome, task.state_version,
  task.cancellation, task.paused, task.deadline, task.ops_active,
  (SELECT id FROM announce) AS outbox_id
FROM op, task
