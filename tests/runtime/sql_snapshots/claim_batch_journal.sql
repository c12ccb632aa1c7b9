WITH c AS (
  SELECT * FROM unnest(%(ids)b::varchar[], %(tasks)b::varchar[], %(versions)b::int[],
    %(generations)b::int[], %(attempts)b::int[], %(froms)b::varchar[])
    AS c(id, task_id, state_version, lease_generation, attempt, from_status)
), d AS (
  SELECT task_id, count(*)::int AS n, count(*)::int * %(d_active)s AS d_active,
    count(*)::int * %(d_claimable)s AS d_claimable, count(*)::int * %(d_blocked)s AS d_blocked
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
    'operation.claimed', %(now)s, c.state_version, c.id, %(actor)s,
    %(event_data)s::jsonb
      || jsonb_build_object('from', c.from_status, 'lease_generation', c.lease_generation,
        'attempt', c.attempt) || jsonb_build_object(
      'task_condition', task.condition, 'task_state_version', task.state_version)
  FROM c JOIN task ON task.id = c.task_id
), inv AS (
  INSERT INTO runtime_invocation
    (operation_id, number, lease_generation, execution_id, started_at, provider_handle)
  SELECT c.id, c.attempt, c.lease_generation, %(execution)s, %(now)s, ''
  FROM c
), spent AS (
  DELETE FROM runtime_outboxmessage WHERE operation_id = ANY(%(ids)b::varchar[])
)
SELECT id, event_seq FROM task
