"""The domain: durable tasks, leased operations, the journal, the outbox. Knows nothing of HTTP."""
