-- The hand-over: a drainer's acceptance and its next claim in one transaction
-- (runtime/operations.py's operation_report_and_claim).


-- name: lock_pair
-- hotpath.lock_pair_txn: both operation rows in ascending id, then their tasks in ascending
-- id, the global lock order for a transaction that accepts one operation and claims another;
-- the writers that follow re-lock what this holds. The join reads the whole locked CTE before
-- the first task row is locked (a task row comes out of a join only once the operations are
-- all read), and the tasks are locked in the order they come out.
WITH o AS MATERIALIZED (
  SELECT id, task_id FROM runtime_operation WHERE id = ANY(%(ids)s::varchar[])
  ORDER BY id FOR NO KEY UPDATE
)
SELECT t.id FROM o JOIN runtime_task t ON t.id = o.task_id
ORDER BY t.id
FOR NO KEY UPDATE OF t
