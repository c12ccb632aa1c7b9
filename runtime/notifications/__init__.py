"""Notifications as operations (docs/notifications.md). The package's modules: ``fanout``
(who hears of an event, on which channel, when), ``dispatch`` (digests and messages as
operations), ``reminders`` (before expiry), ``people`` (preferences, quiet hours, watching),
``endpoints`` (admins' webhooks); the reads are in runtime.selectors.notifications.

1. A trigger wrote a ``NotificationEvent`` in the transaction that made it true
   (runtime.notify_events), or the sweeper did for an approval or wait about to expire
   (``expiry_notice_sweep``).
2. ``fan_out`` (after that commit: a worker on the hint, or the sweeper) writes one
   ``Notification`` per recipient and channel: the people whose role can act on it (policy:
   approvers for an approval, support staff for an unresolved operation, admins for an
   expiring wait or a failed task) and the task's watchers, on the channels they chose, due at
   once or when their quiet hours end; and every configured webhook.
3. ``dispatch_due`` hands due notifications to *one message per recipient, kind and channel
   at most every NOTIFY_DIGEST_SECONDS*: it locks the recipient's stream row, and a message
   sent less than that ago makes the newcomers wait for the next one (a digest). A message is
   an operation of the day's system notification task (never the subject task's: its budget,
   journal and completion stay its own), proposed with the key ``notice:<event>:<recipient>:
   <channel>`` (``runtime.keys.key_notice``), so the worker runs it like any effect: claimed
   under a lease, retried with backoff, its key passed to the receiver, nothing sent inside a
   transaction."""
