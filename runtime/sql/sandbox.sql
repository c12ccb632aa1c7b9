-- The demo receivers' own writes (runtime/sandbox/receivers.py), standing for a remote
-- service: demo.slow is `make bench`'s headline tool, and compiling the ORM's INSERT and
-- UPDATE for every call took a fifth of a worker's CPU there.


-- name: slow_call_start
-- The slow receiver records a call's start (with the deadline time the caller passed on).
INSERT INTO sandbox_slowcall ("key", fencing_token, deadline_remaining, started_at)
VALUES (%s, %s, %s, %s)
RETURNING id


-- name: slow_call_end
-- The slow receiver records a call's end.
UPDATE sandbox_slowcall SET finished_at = %s WHERE id = %s
