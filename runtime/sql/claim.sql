-- The claim: an operation moves to running under its next lease generation, with its journal
-- event and its invocation, and its announcements consumed (runtime/hotpath.py runs these;
-- what they do not cover, runtime/leases.py's general claim does).
--
-- The guards are two tables' rows, rendered in: `claim_guards`, when operation o of task
-- t may be claimed (runtime/rules/claim.py, the rows the general claim checks in order), and
-- `general_writer_not_needed`, what each statement leaves to the general claim
-- (runtime/rules/general_writer.py).
--
-- A guard written `(...) IS TRUE` is one no index can serve: the statements that are handed
-- their operations' ids guard status and compensation that way, so their rows are found by
-- id whatever the statistics say (a queue is often analysed while it holds no work, and the
-- planner, believing few rows pending or running, would pick a status index for the prepared
-- statement's generic plan and read every pending row on every claim).


-- name: claim_set
-- A claim's writes on operation o: running under its next generation; the lease runs on the
-- database's clock, the one the sweeper's takeover compares with (hosts' clocks differ).
status = '{{running}}',
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


-- name: claim_one
-- hotpath.claim_txn: the common claim of one operation. A compensation, and a re-dispatch of
-- a budgeted task's operation, are left to the general claim (it may have to hold its
-- estimate again).
WITH prev AS (
  -- The status the claim leaves, for the journal's "from" (as the general path writes it):
  -- read under the row's lock, so it is the version the UPDATE below replaces. Only a row the
  -- claim can take is locked (a duplicate delivery of running work locks nothing, so a batch
  -- claimer's SKIP LOCKED never skips a row for it), and with the UPDATE's own strength: FOR
  -- UPDATE would also block the key-share locks that rows inserted for the operation by
  -- other transactions take (events, invocations).
  SELECT id, status FROM runtime_operation
  WHERE id = %(id)s AND (status IN {{claim_sources}}) IS TRUE
  FOR NO KEY UPDATE
), op AS (
  UPDATE runtime_operation o SET
    {{claim_set}}
  FROM runtime_task t, prev
  WHERE o.id = prev.id AND t.id = o.task_id
    AND {{claim_guards executor="%(executor)s" supported="%(supported)s"}}
    AND {{general_writer_not_needed form="claim"}}
  RETURNING {{operation_columns alias="o"}},
    t.budget AS task_budget, prev.status AS from_status
), task AS (
  {{task_touch task_id="(SELECT task_id FROM op)"}}
), ev AS (
  {{journal_event data="%(event_data)s::jsonb || jsonb_build_object(
    'from', op.from_status, 'lease_generation', op.lease_generation,
    'attempt', op.attempts_used)"}}
), inv AS (
  {{invocation_start rows="op" number="attempts_used"}}
), spent AS (
  {{outbox_spend operation="(SELECT id FROM op)"}}
)
SELECT {{operation_columns alias="op"}},
  {{task_columns alias="task" prefix="task__"}},
  op.task_budget
FROM op, task


-- name: claim_batch_pick
-- hotpath.claim_batch_txn, first statement: the batch's claimable worker-run operations of
-- unbudgeted tasks, locked in ascending id (skipping rows another claimant holds), moved to running;
-- then their task rows locked in ascending id, after the operation rows (the lock order).
WITH pick AS (
  SELECT o.id, o.status AS from_status FROM runtime_operation o
    JOIN runtime_task t ON t.id = o.task_id
  WHERE o.id = ANY(%(ids)b::varchar[])
    AND {{claim_guards executor="%(executor)s" supported="%(tools)b"}}
    AND {{general_writer_not_needed form="claim_batch"}}
  ORDER BY o.id
  FOR UPDATE OF o SKIP LOCKED
), op AS (
  UPDATE runtime_operation o SET
    {{claim_set}}
  FROM pick WHERE o.id = pick.id AND (o.status IN {{claim_sources}}) IS TRUE
  RETURNING {{operation_columns alias="o"}}, pick.from_status
)
SELECT {{operation_columns alias="op"}},
  t.cancellation, t.condition, t.paused, op.from_status
FROM op JOIN runtime_task t ON t.id = op.task_id
ORDER BY t.id, op.id
FOR UPDATE OF t


-- name: claim_batch_journal
-- hotpath.claim_batch_txn, second statement: the claimed operations' task counters and
-- journal positions, events, invocations, and their announcements consumed.
WITH c AS (
  SELECT * FROM unnest(%(ids)b::varchar[], %(tasks)b::varchar[], %(versions)b::int[],
    %(generations)b::int[], %(attempts)b::int[], %(froms)b::varchar[])
    AS c(id, task_id, state_version, lease_generation, attempt, from_status)
), d AS (
  SELECT task_id, count(*)::int AS n, count(*)::int * %(d_active)s AS d_active,
    count(*)::int * %(d_claimable)s AS d_claimable, count(*)::int * %(d_blocked)s AS d_blocked
  FROM c GROUP BY task_id
), task AS (
  {{batch_task_touch}}
), ev AS (
  {{batch_journal_events type="'operation.claimed'" data="%(event_data)s::jsonb
    || jsonb_build_object('from', c.from_status, 'lease_generation', c.lease_generation,
      'attempt', c.attempt)"}}
), inv AS (
  {{invocation_start rows="c" number="attempt"}}
), spent AS (
  {{outbox_spend operation="ANY(%(ids)b::varchar[])"}}
)
SELECT id, event_seq FROM task
