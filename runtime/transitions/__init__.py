"""The writers of an operation's transitions, one module per transition; each holds its entry
(which opens the transaction, or runs in the caller's: ``*_txn``), its general writer and,
beside it, its PostgreSQL one-statement form. Reads are ``runtime.selectors``'.

- ``propose``: a tool operation's proposal (``operation_propose``, ``operation_propose_txn``)
  and its statement (``propose_txn``).
- ``propose_wait``: the proposal of a durable wait, a signal wait or a timer (``wait_propose``),
  and a signal satisfying it (``wait_satisfy_txn``).
- ``insert``: ``operation_insert_txn``, the one insert of a new operation (tool proposals, waits,
  saga steps) with its ``operation.proposed`` event.
- ``claim``: the claim (``operation_claim``, an agent's ``agent_claim``), its general writer
  (``_claim_txn``, the claim rule's rows in order) and its statement (``claim_txn``).
- ``claim_refusals``: what a claim that may not run settles to (``Refusal``).
- ``claim_batch``: a drainer's batch claim (``operations_claim_batch``, ``claim_batch_txn``).
- ``accept``: the acceptance of a report (``operation_report``, ``agent_report``,
  ``lease_report``), its general writer and its statement (``accept_txn``).
- ``accept_decision``: what a report does (``Report``, ``report_decision``, ``Acceptance``), pure.
- ``accept_batch``: a drainer's batch acceptance (``operations_report_batch``,
  ``accept_batch_txn``).
- ``handover``: a drainer's acceptance and next claim in one transaction
  (``operation_report_and_claim``, ``lock_pair_txn``).
- ``lease``: the lease (``Lease``, tokens, clock), the heartbeat (``lease_heartbeat``), the
  sweeper's takeover of an expired lease (``lease_expire_sweep``), the cancel flag
  (``cancel_requested_txn``).
- ``settle``: settling work that is not running (``operation_settle_txn``,
  ``operation_stop_txn``).
- ``status``: the one guarded status writer (``operation_transition_txn``,
  ``task_transition_txn``, ``attempt_end_txn``, ``approval_transition_txn``) and the
  possible-effect rule.
- ``rejections``: the record of a refused observation (``rejection_record``).
- ``fast``: what the one-statement forms share (rows by column name, the statements' slots,
  publishing after commit, ``StoppedUnderLock``/``PausedUnderLock``/``BatchStopped``).
"""
