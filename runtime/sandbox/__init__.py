"""Simulated receivers for the demo tools. Each keeps its own records in its own tables (never the
runtime's) and is reached only through its tool adapter, so tests can see effects from the
receiver's side: what it committed under a key, whatever the runtime believes."""
