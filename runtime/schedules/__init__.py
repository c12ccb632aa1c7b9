"""Schedules (issue 26 point 2): tasks started at the times a cron expression or an interval
names: ``timing`` (when the slots fall, pure), ``specs`` (what a schedule says), ``services``
(changes by people and agents), ``firing`` (the sweeper's part); the reads are in
runtime.selectors.schedules.

How a slot starts exactly once: the schedule's cursor (``next_slot_at``) names the earliest slot
not yet decided. Whoever decides a slot first inserts its ScheduleRun row, unique on (schedule,
slot time): a second sweeper (or the same one after a restart) that read the same cursor fails
that insert and decides nothing. Only then is the schedule row locked, to recheck that the
cursor, the version and the paused flag are still what the decision was made on, and moved on;
a change in between rolls the claim back. Every writer takes its locks in that order (slot rows
first, then the schedule row), and the ones that touch no new slot (edit, pause, resume, a
buffered slot's start, a token's revocation) lock the schedule row first and insert nothing,
so no two wait on each other in a cycle. The schedule row is locked FOR NO KEY UPDATE (its key
never changes), so the key-share locks that rows referencing it take (slots, tasks, journal
entries) never wait on it.

Each due slot is decided in a transaction of its own: started (a task created through
runtime.tasks' own path: the same validation, budgets and deadline as ``POST /tasks``), skipped
(``overlap``, ``missed`` when it is older than the catch-up window, ``paused``, ``refused`` when
the runtime would not create the task) or ``buffered`` (overlap ``buffer_one``: one slot waits
for the live task to end, and the sweeper starts it then). A schedule whose owner can no
longer act (runtime.schedule_owners) is paused by the decision instead, which starts nothing."""
