INSERT INTO sandbox_slowcall ("key", fencing_token, deadline_remaining, started_at)
VALUES (%s, %s, %s, %s)
RETURNING id
