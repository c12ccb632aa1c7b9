"""Artifact bytes behind django-storages (the ``artifacts`` storage: the filesystem in embedded
mode, S3 through boto3 when configured). Keys are content addresses (``sha256/ab/abcd...``), so
the same bytes are stored once and a key can never name other bytes. Every function here is a
remote call: callers hold no database transaction while they run.

Bytes are only ever streamed in chunks (hashing, writing, verifying, serving): an artifact
larger than memory passes through untouched."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from django.core.files import File
from django.core.files.storage import Storage, storages
from storages.utils import clean_name

from runtime.crashpoints import crash_point

CHUNK = 1024 * 1024
PREFIX = "sha256/"


# Every key this module is handed is one it made: a content address, or the private name an
# upload writes to first. Anything else (a path, "..", another prefix) is refused before the
# storage sees it, whoever supplied it.
_KEY = re.compile(r"sha256/([0-9a-f]{2})/\1[0-9a-f]{62}(\.part-[0-9A-Za-z_-]{1,64})?")


class ContentMissing(Exception):
    """The storage holds no object under the key."""


class BadKey(ValueError):
    """The key is not a content address of this store."""


def key_checked(key: str) -> str:
    """``key`` if it is a content address (or an upload's private name); BadKey otherwise."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise BadKey("not a content key")
    return key


def artifact_storage() -> Storage:
    return storages["artifacts"]


def content_key(hexdigest: str) -> str:
    return key_checked(f"{PREFIX}{hexdigest[:2]}/{hexdigest}")


def hex_of(digest: str) -> str:
    return digest.split(":", 1)[1] if ":" in digest else digest


@dataclass(frozen=True)
class Measured:
    hexdigest: str
    size: int

    @property
    def digest(self) -> str:
        return f"sha256:{self.hexdigest}"


class TooLarge(Exception):
    pass


def measure(chunks: Iterable[bytes], *, limit: int | None = None) -> Measured:
    """sha256 and size of a stream, chunk by chunk; ``TooLarge`` as soon as it passes ``limit``."""
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if limit is not None and size > limit:
            raise TooLarge(f"more than {limit} bytes")
        digest.update(chunk)
    return Measured(digest.hexdigest(), size)


def file_chunks(fileobj: IO[bytes], chunk_size: int = CHUNK) -> Iterator[bytes]:
    fileobj.seek(0)
    while True:
        chunk = fileobj.read(chunk_size)
        if not chunk:
            return
        yield chunk


def _s3(storage: Storage) -> Any | None:
    """The boto3 client when the storage is django-storages' S3 backend, else None."""
    if not hasattr(storage, "bucket_name"):
        return None
    return storage.connection.meta.client  # type: ignore[attr-defined]


def _s3_key(storage: Any, key: str) -> str:

    return str(storage._normalize_name(clean_name(key)))


def content_put(key: str, fileobj: IO[bytes], *, measured: Measured, media_type: str) -> bool:
    """Store ``fileobj`` under its content address. True if this call wrote it, False if the
    bytes were already there (content addressing makes that a success, not a conflict).

    On S3 the write is conditional (``If-None-Match: *``: never overwrite a key) and carries the
    sha256, so the server itself refuses bytes that do not match the digest."""
    key_checked(key)
    storage = artifact_storage()
    client = _s3(storage)
    fileobj.seek(0)
    if client is not None:
        from botocore.exceptions import ClientError  # noqa: PLC0415 (optional: the s3 extra)

        try:
            client.put_object(
                Bucket=storage.bucket_name,  # type: ignore[attr-defined]
                Key=_s3_key(storage, key),
                Body=fileobj,
                ContentType=media_type,
                ContentLength=measured.size,
                IfNoneMatch="*",
                ChecksumSHA256=base64.b64encode(bytes.fromhex(measured.hexdigest)).decode(),
            )
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (409, 412):  # someone stored these bytes first
                return False
            raise
        return True
    if storage.exists(key):
        return False
    # The bytes go to a private name first and are then linked under the key in one step, so
    # the key never names a half-written file (a crash mid-write, or a second upload of the
    # same bytes reading while the first writes). A private file left by a crash is an orphan
    # like any other: the reconciler lists it and deletes it after the retention period.
    partial = storage.save(f"{key}.part-{uuid.uuid4().hex}", File(fileobj, name=key))
    crash_point("artifact.before_link")
    try:
        os.link(storage.path(partial), storage.path(key))
    except FileExistsError:
        return False  # a concurrent upload of the same bytes linked them first
    finally:
        storage.delete(partial)
    return True


def content_chunks(key: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
    key_checked(key)
    storage = artifact_storage()
    try:
        handle = storage.open(key, "rb")
    except FileNotFoundError as exc:
        raise ContentMissing(key) from exc
    with handle:
        while True:
            chunk = handle.read(chunk_size)
            if not chunk:
                return
            yield chunk


def content_verify(key: str, measured: Measured) -> str | None:
    """Read the stored object back, streamed, and compare size and digest. None when they match,
    else why not."""
    try:
        found = measure(content_chunks(key))
    except ContentMissing:
        return "nothing is stored under the key"
    if found.size != measured.size:
        return f"stored size {found.size} differs from the uploaded {measured.size}"
    if found.hexdigest != measured.hexdigest:
        return "stored bytes do not match the uploaded digest"
    return None


def content_open(key: str) -> IO[bytes]:
    key_checked(key)
    try:
        return artifact_storage().open(key, "rb")  # type: ignore[no-any-return]
    except FileNotFoundError as exc:
        raise ContentMissing(key) from exc


def content_delete(key: str) -> None:
    artifact_storage().delete(key_checked(key))


def content_listing() -> Iterator[tuple[str, datetime]]:
    """Every stored content key with its last modification time (for reconciliation)."""
    storage = artifact_storage()
    client = _s3(storage)
    if client is not None:
        prefix = _s3_key(storage, PREFIX)
        base = prefix[: -len(PREFIX)] if prefix.endswith(PREFIX) else ""
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=storage.bucket_name,  # type: ignore[attr-defined]
            Prefix=prefix,
        )
        for page in pages:
            for entry in page.get("Contents", ()):
                key = entry["Key"][len(base) :]
                if _KEY.fullmatch(key):  # nothing else under the prefix is ours to delete
                    yield key, entry["LastModified"]
        return
    root = storage.path(PREFIX)
    for folder, _dirs, files in os.walk(root):
        for filename in files:
            full = os.path.join(folder, filename)
            key = PREFIX + os.path.relpath(full, root).replace(os.sep, "/")
            if _KEY.fullmatch(key):  # nothing else under the prefix is ours to delete
                yield key, datetime.fromtimestamp(os.path.getmtime(full), tz=UTC)
