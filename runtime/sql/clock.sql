-- The database's clock.


-- name: database_now
-- db.db_now where the database has a clock of its own (dialect.database_clock()).
SELECT statement_timestamp() AS now
