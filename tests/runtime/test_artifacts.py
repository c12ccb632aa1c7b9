"""Artifacts: content-addressed storage on both backends (filesystem, S3 over real HTTP to moto),
the stages staged -> stored -> accepted, acceptance guarded on the task's state version (also
under a real concurrent race on PostgreSQL), hostile names, limits, provenance, reconciliation."""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from runtime import artifact_store as store
from runtime.artifact_reconciliation import artifact_reconcile
from runtime.artifacts import (
    UploadSpec,
    artifact_accept,
    artifact_name_clean,
    artifact_upload,
    media_type_clean,
)
from runtime.crashpoints import crash_point_installed
from runtime.errors import (
    InvalidInput,
    PayloadTooLarge,
    StorageUnavailable,
    TransitionRejected,
    UnsupportedMediaType,
)
from runtime.models import Artifact, ContentKey, Operation, Task
from runtime.selectors.artifacts import artifacts_current, provenance_statement
from runtime.transitions.status import task_transition_txn
from tests import factories
from tests.conftest import wait_for


def upload(
    owner,
    task,
    data: bytes,
    name: str = "out.bin",
    media_type: str = "application/octet-stream",
    **spec,
):
    return artifact_upload(
        owner.actor,
        task.pk,
        UploadSpec(name=name, media_type=media_type, **spec),
        io.BytesIO(data),
    )


def version(task) -> int:
    return Task.objects.get(pk=task.pk).state_version


def read_back(artifact) -> bytes:
    return b"".join(store.content_chunks(artifact.storage_key))


# --- digests and both backends ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_digest_and_size_match_the_bytes_of_a_file_larger_than_a_chunk(artifact_backend):
    alice = factories.agent()
    task = factories.task(alice)
    # Several storage chunks plus a ragged tail, with content that differs per chunk.
    data = b"".join(hashlib.sha256(str(i).encode()).digest() * 1024 for i in range(100)) + b"tail"
    assert len(data) > 3 * store.CHUNK
    artifact = upload(alice, task, data)
    assert artifact.status == "stored"
    assert artifact.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert artifact.size == len(data)
    assert artifact.storage_key == f"sha256/{artifact.digest[7:9]}/{artifact.digest[7:]}"
    assert read_back(artifact) == data


@pytest.mark.django_db(transaction=True)
def test_same_bytes_are_stored_once_and_both_rows_read_them(artifact_backend):
    alice = factories.agent()
    task = factories.task(alice)
    first = upload(alice, task, b"identical", name="a.txt", media_type="text/plain")
    second = upload(alice, task, b"identical", name="b.txt", media_type="text/plain")
    assert first.storage_key == second.storage_key
    assert first.pk != second.pk and second.status == "stored"
    assert [k for k, _ in store.content_listing()] == [first.storage_key]
    assert read_back(second) == b"identical"


@pytest.mark.django_db
def test_s3_writes_are_conditional(moto_server, settings):
    from tests.conftest import s3_storage_settings

    settings.STORAGES = {**settings.STORAGES, "artifacts": s3_storage_settings(moto_server)}
    data = b"conditional"
    measured = store.measure([data])
    key = store.content_key(measured.hexdigest)
    assert store.content_put(key, io.BytesIO(data), measured=measured, media_type="text/plain")
    # If-None-Match: * makes the server refuse to overwrite the key: "already stored".
    assert not store.content_put(key, io.BytesIO(data), measured=measured, media_type="text/plain")
    assert [k for k, _ in store.content_listing()] == [key]


@pytest.mark.django_db(transaction=True)
def test_bytes_that_do_not_verify_after_the_write_fail_the_upload(fs_artifacts, monkeypatch):
    alice = factories.agent()
    task = factories.task(alice)

    def corrupt() -> None:
        for path in fs_artifacts.rglob("*"):
            if path.is_file():
                path.write_bytes(b"what was SENT")

    with crash_point_installed("artifact.after_put", corrupt), pytest.raises(StorageUnavailable):
        upload(alice, task, b"what was sent")
    row = Artifact.objects.get(task=task)
    assert row.status == "failed" and "do not match" in row.status_reason


@pytest.mark.django_db(transaction=True)
def test_bytes_stored_but_not_readable_back_yet_are_recovered_not_failed(fs_artifacts, settings):
    settings.ARTIFACT_STAGING_GRACE_SECONDS = 60
    alice = factories.agent()
    task = factories.task(alice)

    def read_error() -> None:
        raise OSError("the storage did not answer the read-back")

    with crash_point_installed("artifact.after_put", read_error), pytest.raises(StorageUnavailable):
        upload(alice, task, b"stored, then the read-back failed")
    row = Artifact.objects.get(task=task)
    assert row.status == "staged" and row.storage_key
    counts = artifact_reconcile(timezone.now() + timedelta(seconds=120))
    assert counts["recovered"] == 1
    row.refresh_from_db()
    assert row.status == "stored" and read_back(row) == b"stored, then the read-back failed"


# --- names, media types, size ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["../../etc/passwd", "a/b", "a\\b", "..", ".hidden", "-rf", "evil\x00.txt", "line\nbreak",
     "x\u202etxt.exe", "", "   ", "a" * 201],
)  # fmt: skip
def test_hostile_names_are_refused(name):
    with pytest.raises(InvalidInput):
        artifact_name_clean(name)


def test_plain_names_are_kept():
    assert artifact_name_clean(" report v2.final.json ") == "report v2.final.json"
    assert artifact_name_clean("résumé.pdf") == "résumé.pdf"


@pytest.mark.django_db
def test_media_types_come_from_the_settings(settings):
    settings.ARTIFACT_MEDIA_TYPES = ["application/json"]
    assert media_type_clean("Application/JSON; charset=utf-8") == "application/json"
    with pytest.raises(UnsupportedMediaType):
        media_type_clean("text/html")


@pytest.mark.django_db(transaction=True)
def test_an_upload_over_the_size_limit_stores_nothing(fs_artifacts, settings):
    settings.ARTIFACT_MAX_BYTES = 1000
    alice = factories.agent()
    task = factories.task(alice)
    with pytest.raises(PayloadTooLarge):
        upload(alice, task, b"x" * 1001)
    assert Artifact.objects.get(task=task).status == "failed"
    assert list(store.content_listing()) == []
    assert upload(alice, task, b"x" * 1000).status == "stored"


# --- acceptance -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_acceptance_against_a_stale_version_is_refused_with_nothing_changed(fs_artifacts):
    alice = factories.agent()
    task = factories.task(alice)
    artifact = upload(alice, task, b"{}", name="r.json", media_type="application/json")
    stale = version(task)
    with transaction.atomic():
        task_transition_txn(
            Task.objects.get(pk=task.pk),
            now=timezone.now(),
            fields={},
            event_type="task.note",
            actor="user:test",
        )
    with pytest.raises(TransitionRejected) as refused:
        artifact_accept(alice.actor, artifact.pk, expected_state_version=stale)
    assert refused.value.code == "state_version_mismatch"
    assert Artifact.objects.get(pk=artifact.pk).status == "stored"
    accepted = artifact_accept(alice.actor, artifact.pk, expected_state_version=stale + 1)
    assert accepted.status == "accepted"
    assert accepted.accepted_state_version == stale + 2 == version(task)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_acceptances_at_one_version_have_one_winner(fs_artifacts):
    """A real race on PostgreSQL: the first acceptance holds its transaction open at a named
    point after its guarded UPDATE; the second is started and observed waiting on the task's
    row lock (pg_stat_activity); then the first commits and the second must be refused."""
    alice = factories.agent()
    task = factories.task(alice)
    first = upload(alice, task, b"one", name="r.txt", media_type="text/plain")
    second = upload(alice, task, b"two", name="r.txt", media_type="text/plain")
    expected = version(task)
    inside, release = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def hold() -> None:
        if threading.current_thread().name == "first":
            inside.set()
            assert release.wait(30)

    def accept(artifact_id: str) -> None:
        try:
            outcomes[threading.current_thread().name] = artifact_accept(
                alice.actor, artifact_id, expected_state_version=expected
            ).status
        except Exception as exc:
            outcomes[threading.current_thread().name] = exc
        finally:
            connection.close()

    with crash_point_installed("artifact.accept_before_commit", hold):
        a = threading.Thread(target=accept, args=(first.pk,), name="first")
        a.start()
        assert inside.wait(30)
        b = threading.Thread(target=accept, args=(second.pk,), name="second")
        b.start()

        def second_waits_on_a_lock() -> bool:
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
                return bool(cur.fetchone()[0])

        wait_for(second_waits_on_a_lock, what="the second acceptance to wait on the row lock")
        release.set()
        a.join(30)
        b.join(30)
    assert outcomes["first"] == "accepted"
    assert isinstance(outcomes["second"], TransitionRejected), outcomes
    assert Artifact.objects.get(pk=second.pk).status == "stored"
    assert list(Artifact.objects.filter(task=task, status="accepted")) == [
        Artifact.objects.get(pk=first.pk)
    ]
    assert version(task) == expected + 1


@pytest.mark.django_db(transaction=True)
def test_accepting_a_name_again_supersedes_the_previous_entry(fs_artifacts):
    alice = factories.agent()
    task = factories.task(alice)
    old = upload(alice, task, b"v1", name="r.txt", media_type="text/plain")
    artifact_accept(alice.actor, old.pk, expected_state_version=version(task))
    new = upload(alice, task, b"v2", name="r.txt", media_type="text/plain")
    artifact_accept(alice.actor, new.pk, expected_state_version=version(task))
    assert Artifact.objects.get(pk=old.pk).status == "superseded"
    assert artifacts_current(task.pk)["r.txt"].pk == new.pk
    # The superseded bytes stay readable: history is kept, not overwritten.
    assert read_back(Artifact.objects.get(pk=old.pk)) == b"v1"


@pytest.mark.django_db(transaction=True)
def test_only_the_tasks_agent_or_an_admin_may_upload_or_accept(fs_artifacts):
    from runtime.errors import NotAuthorized, NotFound

    alice, mallory = factories.agent(), factories.agent()
    operator, admin = factories.console_user("operator"), factories.console_user("admin")
    task = factories.task(alice)
    with pytest.raises(NotFound):
        upload(mallory, task, b"x")
    with pytest.raises(NotAuthorized):
        upload(operator, task, b"x")
    artifact = upload(admin, task, b"x")
    with pytest.raises(NotAuthorized):
        artifact_accept(operator.actor, artifact.pk, expected_state_version=version(task))


# --- provenance -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_provenance_names_the_producing_operation_and_the_inputs(fs_artifacts, settings):
    settings.CODE_VERSION = "agent-console test-build-7"
    alice = factories.agent()
    task = factories.task(alice)
    op = factories.operation(alice, task, step="render", params={"text": "hi"})
    Operation.objects.filter(pk=op.pk).update(execution=None)
    source = upload(alice, task, b"source data", name="input.txt", media_type="text/plain")
    external = "sha256:" + "ab" * 32
    made = upload(
        alice, task, b"rendered", name="out.txt", media_type="text/plain",
        operation_id=op.pk, inputs=[source.pk], input_digests=[external],
    )  # fmt: skip
    assert made.operation_id == op.pk and made.attempt_id == op.attempt_id
    statement = provenance_statement(Artifact.objects.get(pk=made.pk))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [
        {"name": "out.txt", "digest": {"sha256": hashlib.sha256(b"rendered").hexdigest()}}
    ]
    build = statement["predicate"]["buildDefinition"]
    assert build["externalParameters"]["operation"]["id"] == op.pk
    assert build["externalParameters"]["operation"]["idempotency_key"] == op.idempotency_key
    assert build["externalParameters"]["task"] == task.pk
    assert build["internalParameters"]["attempt"]["number"] == 1
    assert [d["digest"]["sha256"] for d in build["resolvedDependencies"]] == [
        hashlib.sha256(b"source data").hexdigest(),
        "ab" * 32,
    ]
    assert statement["predicate"]["runDetails"]["builder"]["version"] == {
        "agent-console": "agent-console test-build-7"
    }
    with pytest.raises(InvalidInput):
        upload(alice, task, b"x", operation_id="op_not_of_this_task")
    with pytest.raises(InvalidInput):
        upload(alice, task, b"x", input_digests=["md5:abc"])


# --- reconciliation -------------------------------------------------------------------------


def _orphan(data: bytes) -> str:
    measured = store.measure([data])
    key = store.content_key(measured.hexdigest)
    store.content_put(key, io.BytesIO(data), measured=measured, media_type="text/plain")
    return key


@pytest.mark.django_db(transaction=True)
def test_reconciliation_deletes_true_orphans_only(artifact_backend, settings):
    settings.ARTIFACT_RETENTION_SECONDS = 3600
    settings.ARTIFACT_STAGING_GRACE_SECONDS = 60
    alice = factories.agent()
    running, ended = factories.task(alice, "running"), factories.task(alice, "ended")
    accepted = upload(alice, ended, b"accepted", name="a.txt", media_type="text/plain")
    artifact_accept(alice.actor, accepted.pk, expected_state_version=version(ended))
    owned = upload(alice, running, b"owned by running work", name="o.txt", media_type="text/plain")
    abandoned = upload(alice, ended, b"never accepted", name="n.txt", media_type="text/plain")
    with transaction.atomic():
        task_transition_txn(
            Task.objects.get(pk=ended.pk),
            now=timezone.now(),
            fields={"outcome": "failed"},
            target_condition="terminal",
            event_type="task.failed",
            actor="user:test",
        )
    # An upload that died after its bytes reached storage: the row is still staged.
    crashed = upload(alice, running, b"crashed after put", name="c.txt", media_type="text/plain")
    Artifact.objects.filter(pk=crashed.pk).update(status="staged")
    # An upload that died before it recorded anything usable.
    lost = Artifact.objects.create(task=running, name="l.txt", media_type="text/plain")
    orphan = _orphan(b"stored, then the registration failed")

    later = timezone.now() + timedelta(seconds=7200)
    counts = artifact_reconcile(later)

    keys = {k for k, _ in store.content_listing()}
    assert orphan not in keys
    assert Artifact.objects.get(pk=abandoned.pk).status == "discarded"
    assert abandoned.storage_key not in keys
    assert {accepted.storage_key, owned.storage_key, crashed.storage_key} <= keys
    assert Artifact.objects.get(pk=owned.pk).status == "stored"
    assert Artifact.objects.get(pk=crashed.pk).status == "stored"  # recovered
    assert Artifact.objects.get(pk=lost.pk).status == "failed"
    assert counts == {"recovered": 1, "failed": 1, "discarded": 1, "deleted": 2}
    # Nothing else is left to do.
    assert artifact_reconcile(later) == {
        "recovered": 0, "failed": 0, "discarded": 0, "deleted": 0,
    }  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_reconciliation_keeps_recent_orphans_within_retention(fs_artifacts, settings):
    settings.ARTIFACT_RETENTION_SECONDS = 3600
    young = _orphan(b"young")
    old = _orphan(b"old")
    path = Path(fs_artifacts) / old
    past = time.time() - 7200
    os.utime(path, (past, past))
    assert artifact_reconcile()["deleted"] == 1
    keys = {k for k, _ in store.content_listing()}
    assert keys == {young}


# --- the reconciler against an upload of the same bytes -------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_upload_of_bytes_being_reclaimed_waits_and_stores_them_anew(fs_artifacts, settings):
    """The reconciler decided the bytes are orphaned and is about to delete them when an upload
    of the same bytes arrives. The upload must not be told "stored" on bytes that vanish a moment
    later: it waits for the deletion, then writes them again."""
    from tests.concurrency import gate_at, in_thread

    settings.ARTIFACT_RETENTION_SECONDS = 3600
    data = b"the same bytes, uploaded again"
    key = _orphan(data)
    alice = factories.agent()
    task = factories.task(alice)
    waiting = threading.Event()
    later = timezone.now() + timedelta(seconds=7200)
    with (
        gate_at("reconcile.before_delete", "reconciler") as gate,
        crash_point_installed("artifact.awaiting_deletion", waiting.set),
    ):
        _, reconciled = in_thread(lambda: artifact_reconcile(later), "reconciler")
        wait_for(gate.reached.is_set, what="the reconciler to decide to delete")
        _, uploaded = in_thread(lambda: upload(alice, task, data), "uploader")
        wait_for(waiting.is_set, what="the upload to wait for the deletion")
        assert Artifact.objects.get(task=task).status == "staged"
        gate.release()
        assert reconciled.result(timeout=30)["deleted"] == 1
        artifact = uploaded.result(timeout=30)
    assert artifact.status == "stored"
    assert artifact.storage_key == key
    assert read_back(artifact) == data
    assert not ContentKey.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_deletion_left_unfinished_holds_uploads_until_the_reconciler_finishes_it(
    fs_artifacts, settings
):
    settings.ARTIFACT_DELETION_WAIT_SECONDS = 0
    settings.ARTIFACT_DELETION_STALE_SECONDS = 60
    data = b"a reconciler died between its decision and the deletion"
    key = _orphan(data)
    ContentKey.objects.create(key=key, deleting_since=timezone.now())
    alice = factories.agent()
    task = factories.task(alice)

    with pytest.raises(StorageUnavailable):
        upload(alice, task, data, name="early.bin")
    assert Artifact.objects.get(task=task, name="early.bin").status == "failed"

    later = timezone.now() + timedelta(seconds=120)
    artifact_reconcile(later)
    assert key not in {k for k, _ in store.content_listing()}
    artifact = upload(alice, task, data, name="again.bin")
    assert artifact.status == "stored"
    assert read_back(artifact) == data


@pytest.mark.django_db(transaction=True)
def test_artifact_stage_events_carry_the_tasks_version(fs_artifacts):
    from runtime.models import Event

    alice = factories.agent()
    task = factories.task(alice)
    artifact = upload(alice, task, b"versioned", name="v.txt", media_type="text/plain")
    artifact_accept(alice.actor, artifact.pk, expected_state_version=version(task))
    stages = dict(
        Event.objects.filter(task=task, type__startswith="artifact.").values_list(
            "type", "state_version"
        )
    )
    before = stages["artifact.staged"]
    assert before >= 1 and stages["artifact.stored"] == before
    assert stages["artifact.accepted"] == before + 1 == version(task)


@pytest.mark.django_db(transaction=True)
def test_the_sweeper_reconciles_artifacts_on_its_own_schedule(fs_artifacts, settings):
    from runtime import sweeper

    settings.ARTIFACT_RETENTION_SECONDS = 0
    sweeper._last_reconcile.clear()
    orphan = _orphan(b"nobody registered these bytes")
    assert sweeper.sweep_once()["artifacts_deleted"] == 1
    assert orphan not in {k for k, _ in store.content_listing()}
    _orphan(b"a second orphan")
    assert "artifacts_deleted" not in sweeper.sweep_once()  # not due again yet


@pytest.mark.django_db(transaction=True)
def test_the_key_never_names_half_written_bytes_on_the_filesystem(fs_artifacts, settings):
    """While one upload is between writing its bytes and linking them under their key, the key
    names nothing; a second upload of the same bytes is stored meanwhile, and the first finds
    them there. A private file a crashed writer left is reclaimed like any orphan."""
    from tests.concurrency import gate_at, in_thread

    alice = factories.agent()
    task = factories.task(alice)
    data = b"written under a private name first" * 1000
    key = store.content_key(hashlib.sha256(data).hexdigest())
    with gate_at("artifact.before_link", "first") as gate:
        _, first = in_thread(lambda: upload(alice, task, data, name="first.bin"), "first")
        wait_for(gate.reached.is_set, what="the first upload to write its bytes")
        assert not store.artifact_storage().exists(key)
        second = upload(alice, task, data, name="second.bin")
        assert second.status == "stored" and read_back(second) == data
        gate.release()
        assert first.result(timeout=30).status == "stored"
    assert [k for k, _ in store.content_listing()] == [key]  # no private file left behind

    leftover = Path(fs_artifacts) / f"{key}.part-crashed"
    leftover.write_bytes(data[:100])
    past = time.time() - 7200
    os.utime(leftover, (past, past))
    settings.ARTIFACT_RETENTION_SECONDS = 3600
    assert artifact_reconcile()["deleted"] == 1
    assert not leftover.exists() and read_back(second) == data
