WITH r AS (
  SELECT * FROM unnest(%(ids)b::varchar[], %(targets)b::varchar[], %(results)b::jsonb[],
    %(errors)b::jsonb[], %(next_ats)b::timestamptz[], %(generations)b::int[],
    %(versions)b::int[]) AS r(id, target, result, error, next_at, generation, state_version)
), locked AS (
  SELECT o.id FROM runtime_operation o WHERE o.id = ANY(%(ids)b::varchar[])
  ORDER BY o.id FOR UPDATE
), op AS (
  UPDATE runtime_operation o SET
    status = r.target,
    state_version = o.state_version + 1,
    result = r.result,
    error = r.error,
    next_attempt_at = r.next_at,
    lease_expires_at = NULL,
    updated_at = %(now)s
  FROM r, locked WHERE o.id = r.id AND locked.id = r.id
    AND (o.status = 'running') IS TRUE
    AND o.lease_generation = r.generation AND o.state_version = r.state_version
    AND o.lease_token_digest = %(digest)s
    AND (o.compensates_id IS NULL) IS TRUE
  RETURNING o.id, o.task_id
)
SELECT op.id, t.cancellation, t.condition FROM op JOIN runtime_task t ON t.id = op.task_id
ORDER BY t.id, op.id
FOR UPDATE OF t
