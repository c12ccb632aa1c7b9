UPDATE runtime_operation SET lease_expires_at = statement_timestamp() + make_interval(secs => %(seconds)s)
WHERE id = %(id)s AND status = 'running' AND lease_generation = %(generation)s
  AND lease_token_digest = %(digest)s
RETURNING cancel_requested, compensates_id,
  (SELECT cancellation FROM runtime_task WHERE runtime_task.id = runtime_operation.task_id)
    AS cancellation,
  (SELECT condition FROM runtime_task WHERE runtime_task.id = runtime_operation.task_id)
    AS condition,
  lease_expires_at
