-- What every API request with a token or an Idempotency-Key reads and writes first, bound on
-- the server (runtime.db.prepared_cursor): compiling the ORM's queries cost more CPU than
-- running them.


-- name: token_live
-- tokens._live_token: the unrevoked token with this prefix and what it acts as (its agent,
-- or its user: the user model's table and columns are slots, the model being swappable).
SELECT t.id, t.digest, t.last_used_at, t.agent_id, a.name AS agent_name, t.user_id,
  u.{{username_column}} AS username, u.is_active AS user_active, t.minted_by
FROM runtime_apitoken t
LEFT JOIN runtime_agent a ON a.id = t.agent_id
LEFT JOIN {{user_table}} u ON u.{{user_pk_column}} = t.user_id
WHERE t.prefix = %s AND t.revoked_at IS NULL


-- name: idempotency_claim
-- idempotent_requests.request_claim_txn (PostgreSQL): the key's advisory lock, then its record
-- read in a snapshot taken once the lock is held (runtime_idempotency_claim, migration 0017);
-- taken is false when another request holds the key, the record's id NULL when it has none.
SELECT c.taken, {{record_columns}}
FROM runtime_idempotency_claim(%s, %s) c


-- name: idempotency_record
-- idempotent_requests.request_record_txn: the key's first response, written in the
-- transaction that made it.
INSERT INTO runtime_idempotentrequest (principal, "key", method, path, body_hash, status,
  response_status, response_body, created_at, finished_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)


-- name: task_for_proposal
-- tasks.task_for_proposal: what a proposal reads of its task, with its current attempt's
-- number; the caller appends the actor's scope as one more condition (policy.task_scope_sql,
-- a few fixed texts and their parameters).
SELECT t.id, t.agent_id, t.created_by_id, t.current_attempt_id, t.deadline, t.budget,
  a.number AS attempt_number
FROM runtime_task t
LEFT JOIN runtime_attempt a ON a.id = t.current_attempt_id
WHERE t.id = %s AND
