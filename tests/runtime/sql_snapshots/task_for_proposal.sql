SELECT t.id, t.agent_id, t.created_by_id, t.current_attempt_id, t.deadline, t.budget,
  a.number AS attempt_number
FROM runtime_task t
LEFT JOIN runtime_attempt a ON a.id = t.current_attempt_id
WHERE t.id = %s AND
