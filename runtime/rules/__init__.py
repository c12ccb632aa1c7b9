"""The runtime's rules as tables: each row a code, a Python predicate, the same predicate in SQL
and what a refusal settles to, so the general writers (Python) and the one-statement forms
(SQL rendered from the rows once at import, ``runtime.sqlfiles``) apply one rule.

- ``stop``: when a task admits no more covered work, and what a stop makes of work.
- ``admission``: when a task admits no new work (``ADMISSION_REFUSALS``).
- ``claim``: when an operation may be claimed (``CLAIM_RULES``).
- ``statuses``: the transition tables (operation, task, cancellation, approval) as data.
- ``general_writer``: when a one-statement form must leave the work to the general writer
  (``general_writer_needed``).

The bottom layer (tests.layers): these modules import only models, the transition tables and
errors, never a service."""
