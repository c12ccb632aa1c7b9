"""The Celery worker's output as the settings' logging has it (with LOG_FORMAT=json, one JSON
object per line). Imported by the worker only (console.celery's ``include``), before it starts.

Celery sets up logging of its own, and writes what a person at a terminal wants to read straight
to the process's stdout: its start-up banner, and notices when it is stopped ("worker: Warm
shutdown (MainProcess)", "Hitting Ctrl+C again ..."). Here:

- the ``setup_logging`` signal, connected, is Celery's documented way to leave logging to the
  application: no handler or format of Celery's is added (to the root, to the pool's children,
  to the task loggers); the settings' LOGGING is in place already (Celery's Django fixup runs
  ``django.setup()`` before the worker starts), the root takes the worker's ``--loglevel``
  as Celery's own setup gave it, and the pool's logger writes through the root's handler;
- with LOG_FORMAT=json the worker is quiet (Celery's ``--quiet``, whoever starts it: make run,
  the Procfile, Kubernetes, the tests) and its banner is one log record instead;
- with LOG_FORMAT=json Celery's notices are log records: they are written by
  ``celery.apps.worker.safe_say``, from its signal handlers, and no switch silences all of them
  (the handlers' ``verbose=False`` covers the first notice only; the cold-shutdown path writes
  its own), so that one function is replaced.
"""

from __future__ import annotations

import logging
from typing import Any

import celery.apps.worker as celery_worker
from celery import signals
from celery.utils.log import get_multiprocessing_logger
from django.conf import settings

log = logging.getLogger("console.worker")


def _json() -> bool:
    return bool(settings.LOG_FORMAT == "json")


@signals.setup_logging.connect
def _logging_is_the_settings(loglevel: int | None = None, **_: Any) -> None:
    if loglevel:
        logging.getLogger().setLevel(loglevel)
    # The pool's own logger (billiard's "multiprocessing": a child that died) does not
    # propagate, and Celery gave it a handler of its own: here it goes to the root's, at
    # Celery's level for it.
    pool = get_multiprocessing_logger()
    if pool is not None:
        pool.propagate = True
        pool.setLevel(logging.ERROR)


def _notice_logged(msg: str, f: Any = None) -> None:
    """``safe_say``'s replacement: the notice as a record. From a signal handler, in the main
    thread: logging's handler lock is re-entrant, so a record being written when the signal came
    is finished first."""
    log.info("%s", msg.strip())


@signals.celeryd_init.connect
def _quiet_when_json(instance: Any, **_: Any) -> None:
    if _json():
        instance.quiet = True
        celery_worker.safe_say = _notice_logged  # type: ignore[attr-defined]  # (not in the stubs)


@signals.celeryd_after_setup.connect
def _banner_logged(sender: str, instance: Any, **_: Any) -> None:
    if _json():
        log.info(
            "celery worker %s starting\n%s%s",
            sender,
            instance.startup_info(artlines=False),
            instance.extra_info() or "",
        )
