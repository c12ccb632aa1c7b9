-- The rows every transition writes beside its own, as fragments the statements include: the
-- task row's journal position and counters, the journal event, the outbox announcement and
-- the invocation. Each is written once here; runtime/sqlfiles.py says how slots fill.


-- name: task_touch
-- The journal's write on the task row {{task_id}}: the next seq, the counters moved by this
-- transition's deltas (bound parameters), the condition derived from them (rendered from
-- statuses.CONDITION_RULES), returning the task row (events.TaskRow).
UPDATE runtime_task SET
  event_seq = event_seq + 1,
  ops_active = ops_active + %(d_active)s,
  ops_claimable = ops_claimable + %(d_claimable)s,
  ops_blocked = ops_blocked + %(d_blocked)s,
  state_version = state_version + CASE WHEN condition <> {{condition_after_deltas}}
    THEN 1 ELSE 0 END,
  condition = {{condition_after_deltas}},
  updated_at = %(now)s
WHERE id = {{task_id}}
RETURNING {{task_columns}}


-- name: task_touch_by_id
-- events.task_touch_txn: the journal's write on the task row of a general writer.
{{task_touch task_id="%(task_id)s"}}


-- name: journal_event
-- The journal row of the operation of CTE op, numbered by the task row CTE task returned:
-- {{data}} (a jsonb expression) and the task's condition after the statement.
INSERT INTO runtime_event (task_id, seq, type, at, state_version, operation_id, actor, data)
SELECT task.id, task.event_seq, %(event_type)s, %(now)s, op.state_version, op.id, %(actor)s,
  {{data}} || jsonb_build_object(
    'task_condition', task.condition, 'task_state_version', task.state_version)
FROM op, task


-- name: batch_task_touch
-- A batch's write on its task rows: CTE d holds each task's count n of events and its
-- counters' deltas; returns each task's new last seq and n.
UPDATE runtime_task SET
  event_seq = event_seq + d.n,
  ops_active = ops_active + d.d_active,
  ops_claimable = ops_claimable + d.d_claimable,
  ops_blocked = ops_blocked + d.d_blocked,
  state_version = state_version + CASE WHEN condition <> {{condition_after_batch_deltas}}
    THEN 1 ELSE 0 END,
  condition = {{condition_after_batch_deltas}},
  updated_at = %(now)s
FROM d WHERE runtime_task.id = d.task_id
RETURNING runtime_task.id, runtime_task.event_seq, runtime_task.condition,
  runtime_task.state_version, d.n


-- name: batch_journal_events
-- A batch's journal rows: one per operation row of CTE c, numbered after its task's earlier
-- events (CTE task returned each task's new last seq and its count n), of type {{type}} and
-- with {{data}} (expressions over c) and the task's condition after the statement.
INSERT INTO runtime_event (task_id, seq, type, at, state_version, operation_id, actor, data)
SELECT task.id,
  task.event_seq - task.n + row_number() OVER (PARTITION BY c.task_id ORDER BY c.id),
  {{type}}, %(now)s, c.state_version, c.id, %(actor)s,
  {{data}} || jsonb_build_object(
    'task_condition', task.condition, 'task_state_version', task.state_version)
FROM c JOIN task ON task.id = c.task_id


-- name: outbox_announce
-- The outbox row announcing worker-run work of operation {{operation}}, due at
-- {{available_at}}, for each row of {{rows}} (the includer adds its RETURNING); its payload
-- names the request that caused the work and the trace context it continues
-- (runtime.outbox.outbox_payload: empty when neither is bound).
INSERT INTO runtime_outboxmessage
  (topic, operation_id, payload, created_at, available_at, publish_count)
SELECT 'operation.execute', {{operation}}, %(outbox_payload)s, %(now)s, {{available_at}}, 0
FROM {{rows}}


-- name: invocation_start
-- The invocation a claim opens, one per row of CTE {{rows}} (its id, its lease generation
-- and its attempt's number in column {{number}}).
INSERT INTO runtime_invocation
  (operation_id, number, lease_generation, execution_id, started_at, provider_handle)
SELECT {{rows}}.id, {{rows}}.{{number}}, {{rows}}.lease_generation, %(execution)s, %(now)s, ''
FROM {{rows}}


-- name: outbox_spend
-- A claim consumes the operation's announcements (the relay must not publish them again).
DELETE FROM runtime_outboxmessage WHERE operation_id = {{operation}}
