-- The proposal: a new pending operation with its journal event and, for worker-run work, its
-- announcement, admitted by the task row it locked.


-- name: propose_one
-- hotpath.propose_txn. The proposal binds to the attempt read under the task's lock: cur
-- locks the task row first (the new operation row is invisible to everyone else, so no lock
-- order is at stake) and, read under that lock, inserts nothing when the current attempt is
-- no longer the one the caller derived the key from: the statement then returns a row of
-- NULLs instead, without failing, and the caller proposes again in the same transaction.
-- A task that admits no work fails the statement (admission_refusal: runtime_refuse).
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
    '{{pending}}', 1, 0, '', 0, %(max_attempts)s, %(deadline)s, false, %(estimate)s,
    %(signal)s, %(timeout_seconds)s, '', false, %(now)s, %(now)s
  FROM cur WHERE cur.same
  ON CONFLICT ON CONSTRAINT operation_key_unique_per_task DO NOTHING
  RETURNING id, task_id, state_version
), task AS (
  {{task_touch task_id="(SELECT task_id FROM op)"}}
), ev AS (
  {{journal_event data="%(event_data)s::jsonb"}}
), announce AS (
  {{outbox_announce operation="op.id" available_at="%(now)s" rows="op WHERE %(announce)s"}}
  RETURNING id
)
SELECT {{task_columns alias="task"}},
  (SELECT id FROM announce) AS outbox_id,
  {{admission_refusal task="task" now="%(now)s"}} AS admitted
FROM op, task
UNION ALL
SELECT {{task_nulls}}, NULL, NULL FROM cur WHERE cur.same IS NOT TRUE
