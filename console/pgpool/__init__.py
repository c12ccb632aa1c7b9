"""The web server's database engine (settings.database_pooled): Django's PostgreSQL backend
whose connection pool checks a connection without a round trip (console.pgpool.base)."""
