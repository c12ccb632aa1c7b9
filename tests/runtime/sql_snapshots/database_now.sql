SELECT statement_timestamp() AS now
