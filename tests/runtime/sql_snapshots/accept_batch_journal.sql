WITH c AS (
  SELECT * FROM unnest(%(ids)b::varchar[], %(tasks)b::varchar[], %(versions)b::int[],
    %(generations)b::int[], %(d_actives)b::int[], %(d_claimables)b::int[],
    %(d_blockeds)b::int[], %(event_types)b::varchar[], %(event_datas)b::jsonb[],
    %(inv_outcomes)b::varchar[], %(receipts)b::jsonb[], %(handles)b::varchar[],
    %(announce_ats)b::timestamptz[])
    AS c(id, task_id, state_version, generation, d_active, d_claimable, d_blocked, event_type,
      event_data, inv_outcome, receipt, handle, announce_at)
), d AS (
  SELECT task_id, count(*)::int AS n, sum(d_active)::int AS d_active,
    sum(d_claimable)::int AS d_claimable, sum(d_blocked)::int AS d_blocked
  FROM c GROUP BY task_id
), task AS (
  UPDATE runtime_task SET
    event_seq = event_seq + d.n,
    ops_active = ops_active + d.d_active,
    ops_claimable = ops_claimable + d.d_claimable,
    ops_blocked = ops_blocked + d.d_blocked,
    state_version = state_version + CASE WHEN condition <> CASE WHEN condition = 'terminal' THEN 'terminal'
      WHEN ops_active + d.d_active > 0 THEN 'running'
      WHEN ops_claimable + d.d_claimable > 0 THEN 'runnable'
      WHEN ops_blocked + d.d_blocked > 0 THEN 'waiting'
      ELSE 'runnable' END
      THEN 1 ELSE 0 END,
    condition = CASE WHEN condition = 'terminal' THEN 'terminal'
      WHEN ops_active + d.d_active > 0 THEN 'running'
      WHEN ops_claimable + d.d_claimable > 0 THEN 'runnable'
      WHEN ops_blocked + d.d_blocked > 0 THEN 'waiting'
      ELSE 'runnable' END,
    updated_at = %(now)s
  FROM d WHERE runtime_task.id = d.task_id
  RETURNING runtime_task.id, runtime_task.event_seq, runtime_task.condition,
    runtime_task.state_version, d.n
), ev AS (
  INSERT INTO runtime_event (task_id, seq, type, at, state_version, operation_id, actor, data)
  SELECT task.id,
    task.event_seq - task.n + row_number() OVER (PARTITION BY c.task_id ORDER BY c.id),
    c.event_type, %(now)s, c.state_version, c.id, %(actor)s,
    c.event_data || jsonb_build_object(
      'task_condition', task.condition, 'task_state_version', task.state_version)
  FROM c JOIN task ON task.id = c.task_id
), inv AS (
  UPDATE runtime_invocation i SET outcome = c.inv_outcome, finished_at = %(now)s,
    receipt = c.receipt, provider_handle = c.handle
  FROM c WHERE i.operation_id = ANY(%(ids)b::varchar[])
    AND i.operation_id = c.id AND i.lease_generation = c.generation
), announce AS (
  INSERT INTO runtime_outboxmessage
    (topic, operation_id, payload, created_at, available_at, publish_count)
  SELECT 'operation.execute', c.id, %(outbox_payload)s, %(now)s, c.announce_at, 0
  FROM c WHERE c.announce_at IS NOT NULL
  RETURNING id, operation_id, available_at
)
SELECT 'task' AS kind, id AS key, event_seq::bigint AS number, NULL::timestamptz AS available_at
FROM task
UNION ALL SELECT 'outbox', operation_id, id, available_at FROM announce
