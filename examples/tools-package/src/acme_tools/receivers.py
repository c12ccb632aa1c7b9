"""Stand-ins for the services the tools call: a CRM and an invoicing API, kept in one SQLite
file so that the web, every worker and the tests see the same records.

In your package these are the vendors' HTTP clients. What the tools rely on is how those
services behave, which this file imitates:

- the CRM creates a new contact for every request, even a repeated one, but stores the
  ``external_ref`` a caller sends and can be searched by it (so the tool's contract is
  ``lookup``);
- the invoicing API keeps the first answer per ``Idempotency-Key`` and returns it again for a
  repeat (contract ``replay``), refuses a request with an older fencing token than one it has
  seen under the same key, and voids an invoice any number of times with the same result.

``fail_next`` makes the next calls fail the way networks do: an answer with a status (503, 429,
400...), or ``"timeout"``: the request is carried out, then the answer is lost."""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
create table if not exists contacts (
  id text primary key, email text not null, name text not null, external_ref text not null
);
create table if not exists invoices (
  id text primary key, customer text not null, amount_cents integer not null,
  currency text not null, status text not null
);
create table if not exists idempotency (
  key text primary key, fencing_token integer not null, status integer not null, body text not null
);
create table if not exists faults (id integer primary key autoincrement, kind text not null);
"""


class ReceiverTimeout(TimeoutError):
    """No answer came back: the request may have been carried out."""


@dataclass(frozen=True)
class Response:
    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def database_path() -> Path:
    """``ACME_RECEIVERS_DB``, or one file in the temporary directory shared by every process."""
    return Path(
        os.environ.get("ACME_RECEIVERS_DB") or Path(tempfile.gettempdir()) / "acme-receivers.db"
    )


@contextmanager
def _db() -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(database_path(), timeout=30, isolation_level=None)
    try:
        conn.executescript(_SCHEMA)
        conn.execute("begin immediate")  # one writer at a time: the receivers' own atomicity
        yield conn
        conn.execute("commit")
    except BaseException:
        if conn.in_transaction:
            conn.execute("rollback")
        raise
    finally:
        conn.close()


def fail_next(*kinds: int | str) -> None:
    """Make the next calls fail, one kind each: an HTTP status, or ``"timeout"``."""
    with _db() as db:
        db.executemany("insert into faults (kind) values (?)", [(str(k),) for k in kinds])


def _fault(db: sqlite3.Connection) -> str | None:
    row = db.execute("select id, kind from faults order by id limit 1").fetchone()
    if row is None:
        return None
    db.execute("delete from faults where id = ?", (row[0],))
    return str(row[1])


def _answer(fault: str | None, response: Response) -> Response:
    if fault == "timeout":
        raise ReceiverTimeout("no answer within the timeout")
    return response


class Crm:
    """A CRM's contacts API: ``POST /contacts`` and ``GET /contacts?external_ref=``."""

    def create_contact(self, *, email: str, name: str, external_ref: str) -> Response:
        with _db() as db:
            fault = _fault(db)
            if fault is not None and fault != "timeout":
                return Response(int(fault), {"error": f"injected {fault}"})
            contact = {"id": f"ct_{uuid.uuid4().hex[:12]}", "email": email, "name": name}
            db.execute(
                "insert into contacts values (?, ?, ?, ?)",
                (contact["id"], email, name, external_ref),
            )
        return _answer(fault, Response(201, {**contact, "external_ref": external_ref}))

    def find_contact(self, *, external_ref: str) -> Response:
        with _db() as db:
            row = db.execute(
                "select id, email, name from contacts where external_ref = ? order by rowid",
                (external_ref,),
            ).fetchone()
        if row is None:
            return Response(404, {"error": "no contact with that external_ref"})
        return Response(
            200, {"id": row[0], "email": row[1], "name": row[2], "external_ref": external_ref}
        )

    def contacts(self) -> list[dict[str, Any]]:
        with _db() as db:
            rows = db.execute("select id, email, external_ref from contacts order by rowid")
            return [{"id": r[0], "email": r[1], "external_ref": r[2]} for r in rows]


class Billing:
    """An invoicing API that honours ``Idempotency-Key``: ``POST /invoices`` and
    ``POST /invoices/{id}/void``."""

    def send_invoice(
        self,
        *,
        idempotency_key: str,
        fencing_token: int,
        customer: str,
        amount_cents: int,
        currency: str,
    ) -> Response:
        with _db() as db:
            fault = _fault(db)
            if fault is not None and fault != "timeout":
                return Response(int(fault), {"error": f"injected {fault}"})
            seen = db.execute(
                "select fencing_token, status, body from idempotency where key = ?",
                (idempotency_key,),
            ).fetchone()
            if seen is not None and fencing_token < seen[0]:
                # A newer lease holder already acted under this key.
                return Response(409, {"error": "stale_fencing_token"})
            if seen is not None:
                return _answer(fault, Response(seen[1], json.loads(seen[2])))
            invoice = {
                "id": f"in_{uuid.uuid4().hex[:12]}",
                "customer": customer,
                "amount_cents": amount_cents,
                "currency": currency,
                "status": "sent",
            }
            db.execute(
                "insert into invoices values (?, ?, ?, ?, ?)",
                (invoice["id"], customer, amount_cents, currency, "sent"),
            )
            db.execute(
                "insert into idempotency values (?, ?, ?, ?)",
                (idempotency_key, fencing_token, 201, json.dumps(invoice)),
            )
        return _answer(fault, Response(201, invoice))

    def void_invoice(self, *, invoice: str) -> Response:
        with _db() as db:
            fault = _fault(db)
            if fault is not None and fault != "timeout":
                return Response(int(fault), {"error": f"injected {fault}"})
            row = db.execute("select id from invoices where id = ?", (invoice,)).fetchone()
            if row is None:
                return Response(404, {"error": "no such invoice"})
            db.execute("update invoices set status = 'void' where id = ?", (invoice,))
        return _answer(fault, Response(200, {"id": invoice, "status": "void"}))

    def invoices(self) -> list[dict[str, Any]]:
        with _db() as db:
            rows = db.execute(
                "select id, customer, amount_cents, status from invoices order by rowid"
            )
            return [
                {"id": r[0], "customer": r[1], "amount_cents": r[2], "status": r[3]} for r in rows
            ]
