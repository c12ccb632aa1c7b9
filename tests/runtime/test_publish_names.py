"""The modules that announce work publish by task name (runtime.publish) and never import the
Celery tasks; the names must be the worker's registered tasks, or every announcement would be
a message nobody consumes."""

from __future__ import annotations

from celery import current_app

import runtime.worker  # noqa: F401  (registers the shared tasks)
from runtime.publish import TASK_NAMES


def test_every_published_name_is_a_registered_task():
    registered = set(current_app.tasks.keys())
    assert set(TASK_NAMES) <= registered, set(TASK_NAMES) - registered


def test_the_publishing_modules_do_not_import_the_worker():
    import ast
    import pathlib

    for module in ("outbox", "executor", "waits", "publish"):
        tree = ast.parse(
            pathlib.Path(__file__).resolve().parents[2] / "runtime" / f"{module}.py".read_text()
        )
        imported = {
            n.module
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module is not None
        } | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "runtime.worker" not in imported, module
