"""A request whose transaction the database rolls back because of concurrent ones (a lock it
would not wait longer for, a deadlock it broke, a locked SQLite table) is 503 `busy` with
Retry-After, in the error format, and changes nothing: never a 500. Both databases."""

from __future__ import annotations

import pytest
from django.db import connection

from runtime.models import Task
from tests import factories


@pytest.mark.django_db(transaction=True)
def test_a_request_rolled_back_by_contention_is_503_busy_and_changes_nothing():
    owner = factories.agent()
    task = factories.task(owner)
    client = owner.client()
    assert client.get(f"/api/v1/tasks/{task.pk}").status_code == 200  # token's first use

    other = connection.get_new_connection(connection.get_connection_params())
    try:
        if connection.features.has_select_for_update:  # row locks (SQLite locks the database)
            with connection.cursor() as cur:
                cur.execute("SET lock_timeout = '200ms'")
            other.execute("SELECT 1 FROM runtime_task WHERE id = %s FOR UPDATE", [task.pk])
        else:
            # Another writer inside its transaction on the same table.
            other.execute("BEGIN IMMEDIATE")
            other.execute("UPDATE runtime_task SET name = name WHERE id = ?", [task.pk])
        response = client.post(f"/api/v1/tasks/{task.pk}/pause", {}, format="json")
    finally:
        other.rollback()
        other.close()
        if connection.features.has_select_for_update:
            with connection.cursor() as cur:
                cur.execute("RESET lock_timeout")

    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "busy"
    assert response["Retry-After"] == "1"
    assert not Task.objects.get(pk=task.pk).paused
    # Sent again once the other transaction is gone, the same request goes through.
    assert client.post(f"/api/v1/tasks/{task.pk}/pause", {}, format="json").status_code == 202
