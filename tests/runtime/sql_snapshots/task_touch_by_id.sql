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
WHERE id = %(task_id)s
RETURNING id, event_seq, condition, outcome, state_version, cancellation, paused, deadline,
  ops_active
