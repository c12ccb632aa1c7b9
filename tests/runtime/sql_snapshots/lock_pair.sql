WITH o AS MATERIALIZED (
  SELECT id, task_id FROM runtime_operation WHERE id = ANY(%(ids)s::varchar[])
  ORDER BY id FOR NO KEY UPDATE
)
SELECT t.id FROM o JOIN runtime_task t ON t.id = o.task_id
ORDER BY t.id
FOR NO KEY UPDATE OF t
