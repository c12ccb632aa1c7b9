SELECT t.id, t.digest, t.last_used_at, t.agent_id, a.name AS agent_name, t.user_id,
  u.username AS username, u.is_active AS user_active, t.minted_by
FROM runtime_apitoken t
LEFT JOIN runtime_agent a ON a.id = t.agent_id
LEFT JOIN auth_user u ON u.id = t.user_id
WHERE t.prefix = %s AND t.revoked_at IS NULL
