-- The acceptance of a report: a running operation moves to the target the report decided
-- (runtime/operations.py's report_decision, from the claim's snapshot), with its journal
-- event, its invocation's outcome, and for a retry of worker-run work its announcement.


-- name: accept_one
-- hotpath.accept_txn: the report on a covered operation of an unstopped task, guarded by
-- the claim (generation, state version, token).
WITH op AS (
  UPDATE runtime_operation o SET
    status = %(target)s,
    state_version = o.state_version + 1,
    result = %(result)s,
    error = %(error)s,
    next_attempt_at = %(next_at)s,
    lease_expires_at = NULL,
    updated_at = %(now)s
  WHERE o.id = %(id)s AND (o.status = '{{running}}') IS TRUE
    AND o.lease_generation = %(generation)s AND o.state_version = %(state_version)s
    AND o.lease_token_digest = %(digest)s AND {{general_writer_not_needed form="accept"}}
    AND EXISTS (
      SELECT 1 FROM runtime_task t WHERE t.id = o.task_id AND {{not_stopping alias="t"}})
  RETURNING o.id, o.task_id, o.state_version
), task AS (
  {{task_touch task_id="(SELECT task_id FROM op)"}}
), ev AS (
  {{journal_event data="%(event_data)s::jsonb"}}
), inv AS (
  UPDATE runtime_invocation SET outcome = %(inv_outcome)s, finished_at = %(now)s,
    receipt = %(receipt)s, provider_handle = %(handle)s
  WHERE operation_id = (SELECT id FROM op) AND lease_generation = %(generation)s
), announce AS (
  {{outbox_announce operation="op.id" available_at="%(next_at)s" rows="op WHERE %(announce)s"}}
  RETURNING id
)
SELECT {{task_columns alias="task"}},
  (SELECT id FROM announce) AS outbox_id
FROM op, task


-- name: accept_batch_pick
-- hotpath.accept_batch_txn, first statement: the batch's reports written on the operations
-- still under their claims (locked in ascending id), then their task rows locked in
-- ascending id (the lock order).
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
    AND (o.status = '{{running}}') IS TRUE
    AND o.lease_generation = r.generation AND o.state_version = r.state_version
    AND o.lease_token_digest = %(digest)s
    AND {{general_writer_not_needed form="accept_batch"}}
  RETURNING o.id, o.task_id
)
SELECT op.id, t.cancellation, t.condition FROM op JOIN runtime_task t ON t.id = op.task_id
ORDER BY t.id, op.id
FOR UPDATE OF t


-- name: accept_batch_journal
-- hotpath.accept_batch_txn, second statement: the accepted operations' task counters and
-- journal positions, events, invocations' outcomes, and a retry's announcement; one row per
-- task (kind 'task': its last seq) and per announcement (kind 'outbox').
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
  {{batch_task_touch}}
), ev AS (
  {{batch_journal_events type="c.event_type" data="c.event_data"}}
), inv AS (
  UPDATE runtime_invocation i SET outcome = c.inv_outcome, finished_at = %(now)s,
    receipt = c.receipt, provider_handle = c.handle
  FROM c WHERE i.operation_id = ANY(%(ids)b::varchar[])
    AND i.operation_id = c.id AND i.lease_generation = c.generation
), announce AS (
  {{outbox_announce operation="c.id" available_at="c.announce_at"
    rows="c WHERE c.announce_at IS NOT NULL"}}
  RETURNING id, operation_id, available_at
)
SELECT 'task' AS kind, id AS key, event_seq::bigint AS number, NULL::timestamptz AS available_at
FROM task
UNION ALL SELECT 'outbox', operation_id, id, available_at FROM announce
