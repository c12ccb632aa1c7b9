INSERT INTO runtime_idempotentrequest (principal, "key", method, path, body_hash, status,
  response_status, response_body, created_at, finished_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
