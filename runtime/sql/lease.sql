-- The lease a claim holds: its heartbeat (runtime/leases.py). Takeover and settling run on
-- the general writers (runtime/statemachine.py).


-- name: lease_heartbeat_update
-- Extend the lease of operation %(id)s to {{expires}} under the caller's claim (generation and
-- token), and read the stop flags in the same breath (stoprule.stop_asked decides from them).
UPDATE runtime_operation SET lease_expires_at = {{expires}}
WHERE id = %(id)s AND status = '{{running}}' AND lease_generation = %(generation)s
  AND lease_token_digest = %(digest)s
RETURNING cancel_requested, compensates_id,
  (SELECT cancellation FROM runtime_task WHERE runtime_task.id = runtime_operation.task_id)
    AS cancellation,
  (SELECT condition FROM runtime_task WHERE runtime_task.id = runtime_operation.task_id)
    AS condition,
  lease_expires_at


-- name: lease_heartbeat
-- leases.lease_heartbeat on a database without a clock of its own (dialect.database_clock()
-- false: the embedded mode, one host): the caller's expiry.
{{lease_heartbeat_update expires="%(expires)s"}}


-- name: lease_heartbeat_database_clock
-- leases.lease_heartbeat on a database with a clock of its own: the expiry is the database's
-- clock plus the lease, never the caller's now (a worker's clock, maybe skewed against the
-- sweeper's host).
{{lease_heartbeat_update expires="statement_timestamp() + make_interval(secs => %(seconds)s)"}}
