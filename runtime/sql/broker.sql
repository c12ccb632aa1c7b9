-- The embedded broker's table (kombu's SQLAlchemy transport, on its own database).


-- name: embedded_broker_purge
-- sweeper.embedded_broker_purge: kombu's SQLAlchemy transport never deletes delivered
-- messages (it only hides them), so the embedded broker's file would grow forever.
DELETE FROM kombu_message WHERE visible = 0
