"""The few lines where the async and the sync client differ by more than ``async``/``await``:
sleeping, and a heartbeat running beside the caller (a task of the running loop; a thread).
``_async.py`` names the async forms; unasync (client/generate.py) turns those names into the sync
ones in ``_sync.py`` (``AsyncBeat`` to ``SyncBeat``, ``async_sleep`` to ``sync_sleep``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable

AsyncSleep = Callable[[float], Awaitable[None]]
SyncSleep = Callable[[float], None]
async_sleep: AsyncSleep = asyncio.sleep
sync_sleep: SyncSleep = time.sleep


class AsyncBeat:
    """Calls ``beat`` every ``every`` seconds in a task of the running loop, until ``stop`` or
    until ``beat`` answers False."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def start(self, beat: Callable[[], Awaitable[bool]], every: float, name: str) -> None:
        self._task = asyncio.create_task(self._run(beat, every), name=name)

    async def _run(self, beat: Callable[[], Awaitable[bool]], every: float) -> None:
        while True:
            await asyncio.sleep(every)
            if not await beat():
                return

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class SyncBeat:
    """Calls ``beat`` every ``every`` seconds in a daemon thread, until ``stop`` or until
    ``beat`` answers False."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, beat: Callable[[], bool], every: float, name: str) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(beat, every), name=name, daemon=True
        )
        self._thread.start()

    def _run(self, beat: Callable[[], bool], every: float) -> None:
        while not self._stop.wait(every):
            if not beat():
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
