"""The seeded simulation (issue 22; docs/simulation.md): the runtime's real services and SQL
driven by a deterministic scheduler on a fake clock, with injected faults, and invariants
checked after every step. Test tooling of the domain: nothing in the runtime imports it."""
