"""The service's store on both back-ends (service/storage/): every
test runs on SQLite files and on a real PostgreSQL database (tests/postgres_server.py; skipped
with the reason where none can be started). "Two replicas" are two independently opened
``Databases`` on one database, as two processes would open them.
"""

from __future__ import annotations

import threading
import time

import pytest

from service.errors import NotFound, StoreUnavailable
from service.storage.databases import Databases, open_databases
from service.storage.document_claims import DocumentClaims
from service.storage.documents import DocumentStore
from service.storage.glossaries import GlossaryStore
from service.storage.memories import PAIR_DEFAULT, MemoryChoice, MemoryEntriesError, MemoryStore
from service.web.errors import ApiError
from service.web.file_store import TranslatedFiles
from service.web.quota import CharacterQuota
from service.web.rate_limits import RateLimiter
from service.web.shared_limits import SharedRateLimiter


@pytest.fixture(params=["sqlite", "postgresql"])
def replicas(request, tmp_path):
    """``open()`` -> a new ``Databases`` on this test's one database (a replica's view)."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    opened: list[Databases] = []

    def open_one() -> Databases:
        opened.append(open_databases(tmp_path / "data", url))
        return opened[-1]

    yield open_one
    for databases in opened:
        databases.close()


# --- glossaries and memories -------------------------------------------------------------------


def test_a_glossary_stored_through_one_replica_is_used_and_deleted_through_another(replicas):
    a, b = GlossaryStore(replicas().main, 10), GlossaryStore(replicas().main, 10)
    info = a.create("ui", "en", "de", [("save", "sichern"), ("file", "Datei")])
    assert b.list() == [info] and b.entries(info.glossary_id) == [
        ("save", "sichern"),
        ("file", "Datei"),
    ]
    assert b.glossary(info.glossary_id).entries == a.glossary(info.glossary_id).entries
    b.delete(info.glossary_id)
    # a compiled it before: the deletion elsewhere still holds here.
    with pytest.raises(NotFound):
        a.glossary(info.glossary_id)


def test_glossaries_carry_their_owner(replicas):
    store = GlossaryStore(replicas().main, 10)
    mine = store.create("mine", "en", "de", [("a", "b")], owner_key="key-a")
    shared = store.create("shared", "en", "de", [("c", "d")])
    assert [g.name for g in store.list(owner_key="key-b")] == ["shared"]
    assert [g.name for g in store.list(owner_key="key-a")] == ["mine", "shared"]
    assert store.info(mine.glossary_id).owner_key == "key-a" and shared.owner_key is None
    with pytest.raises(NotFound):
        store.delete(mine.glossary_id, owner_key="key-b")
    store.delete(mine.glossary_id, owner_key="key-a")


def test_a_memory_posted_through_one_replica_answers_through_another(replicas):
    a, b = MemoryStore(replicas().main, 100), MemoryStore(replicas().main, 100)
    first = a.add(None, "en", "de", [("Save  changes", "Speichern"), ("Quit", "Beenden")])
    assert first.created and (first.added, first.replaced) == (2, 0)
    again = b.add(None, "en", "de", [("Save changes", "Änderungen speichern")])
    assert not again.created and (again.added, again.replaced) == (0, 1)
    lookup = a.lookup(PAIR_DEFAULT, "en", "de")
    assert lookup is not None and lookup(" Save changes ") == "Änderungen speichern"
    # A key's default is its own, read before the shared one, on every replica.
    own = b.add(None, "en", "de", [("Quit", "Schließen")], owner_key="k")
    assert own.created and own.info.owner_key == "k"
    keyed = a.lookup(MemoryChoice(owner_key="k"), "en", "de")
    assert keyed is not None and (keyed("Quit"), keyed("Save changes")) == (
        "Schließen",
        "Änderungen speichern",
    )
    assert lookup("Quit") == "Beenden"
    b.add("docs", "en", "fr", [("a", "b")], owner_key="k")
    assert a.info("docs", owner_key="k").owner_key == "k"
    with pytest.raises(MemoryEntriesError):  # another pair: refused, nothing written
        a.add("docs", "en", "de", [("x", "y")], owner_key="k")
    with pytest.raises(MemoryEntriesError):
        a.lookup(MemoryChoice("docs", owner_key="k"), "en", "de")
    assert b.entries("docs", owner_key="k") == [("a", "b")]


def test_usage_is_counted_once_across_replicas(replicas):
    a = CharacterQuota(replicas().main, limit=10)
    b = CharacterQuota(replicas().main, limit=10)
    a.record("key:k", 6, 1)
    b.record("key:k", 3, 0)
    assert a.usage("key:k").characters == 9 and b.usage("key:k").memory_segments == 1
    with pytest.raises(ApiError) as refused:
        b.check("key:k", 2)
    assert refused.value.status == 456


# --- document jobs ------------------------------------------------------------------------------


def test_a_job_is_claimed_by_one_replica_and_taken_over_when_its_lease_runs_out(replicas):
    a = DocumentStore(replicas().documents, ttl_s=3600)
    b = DocumentStore(replicas().documents, ttl_s=3600)
    job = a.create("a.txt", b"one.\ntwo.\n", "en", "de", 2, 8, owner_key="key-a")
    assert b.get(job.job_id).owner_key == "key-a"
    assert DocumentClaims(a).claim("replica-a", lease_s=0.3).job_id == job.job_id
    assert DocumentClaims(b).claim("replica-b", lease_s=0.3) is None  # held
    assert DocumentClaims(a).progress(job.job_id, "replica-a", 1, lease_s=0.3)
    assert b.get(job.job_id).sentences_done == 1  # progress seen everywhere
    time.sleep(0.4)  # replica-a stops renewing: its lease runs out
    taken = DocumentClaims(b).claim("replica-b", lease_s=30)
    assert taken.job_id == job.job_id and taken.sentences_done == 0
    # The first holder can no longer write anything for it.
    assert not DocumentClaims(a).progress(job.job_id, "replica-a", 2, lease_s=30)
    assert not DocumentClaims(a).finish(job, "replica-a", "a.txt", b"LATE")
    assert not DocumentClaims(a).renew(job.job_id, "replica-a", 30)
    assert b.upload(taken) == b"one.\ntwo.\n"
    assert DocumentClaims(b).finish(taken, "replica-b", "a.txt", b"ONE.\nTWO.\n")
    done = a.get(job.job_id)
    assert done.status == "done" and a.result(done) == b"ONE.\nTWO.\n"


def test_concurrent_claims_take_each_job_exactly_once(replicas):
    stores = [DocumentStore(replicas().documents, ttl_s=3600) for _ in range(4)]
    claims = [DocumentClaims(store) for store in stores]
    jobs = {stores[0].create(f"{n}.txt", b"x.\n", "en", "de", 1, 2).job_id for n in range(12)}
    claimed: list[tuple[str, str]] = []
    lock = threading.Lock()

    def claimer(index: int) -> None:
        while (job := claims[index].claim(f"replica-{index}", lease_s=60)) is not None:
            with lock:
                claimed.append((job.job_id, f"replica-{index}"))

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(job_id for job_id, _ in claimed) == sorted(jobs)


def test_a_cancelled_job_is_no_longer_its_holders_and_loses_its_files(replicas):
    a = DocumentStore(replicas().documents, ttl_s=3600)
    b = DocumentStore(replicas().documents, ttl_s=3600)
    job = a.create("a.txt", b"one.\n", "en", "de", 1, 4)
    DocumentClaims(a).claim("replica-a", lease_s=30)
    assert b.cancel(job.job_id).status == "cancelled"
    assert not DocumentClaims(a).renew(job.job_id, "replica-a", 30)
    assert not DocumentClaims(a).finish(job, "replica-a", "a.txt", b"ONE.\n")
    with pytest.raises(NotFound):
        a.upload(job)


def test_finished_jobs_are_swept_with_their_files(replicas):
    store = DocumentStore(replicas().documents, ttl_s=0.0)
    job = store.create("a.txt", b"one.\n", "en", "de", 1, 4)
    DocumentClaims(store).claim("r", lease_s=30)
    DocumentClaims(store).fail(job.job_id, "r", "boom")
    assert store.get(job.job_id).error == "boom"
    assert store.sweep() == 1
    with pytest.raises(NotFound):
        store.get(job.job_id)


# --- rate limits and downloads ------------------------------------------------------------------


def test_shared_rate_limits_answer_as_the_in_memory_ones_and_hold_across_replicas(replicas):
    # not in the past: limits' memory storage drops entries whose expiry the real clock has
    # passed (its expiry timer, 10 ms after the limiter is made, reads time.time)
    now = [time.time()]
    memory = RateLimiter(clock=lambda: now[0])
    a = SharedRateLimiter(replicas().main, clock=lambda: now[0])
    b = SharedRateLimiter(replicas().main, clock=lambda: now[0])
    limits = dict(requests_per_minute=3, chars_per_minute=100)
    for step, (chars, advance) in enumerate(
        [(10, 1), (50, 5), (30, 10), (5, 1), (20, 50), (90, 5)]
    ):
        shared = (a, b)[step % 2].charge("key:k", chars=chars, **limits)
        assert shared == memory.charge("key:k", chars=chars, **limits), step
        now[0] += advance
    assert a.charge("key:k", chars=500, **limits).retry_after_s is None  # never fits
    assert b.charge("other", chars=1, **limits) is None  # each identity its own window


def test_translated_files_in_the_shared_database_download_from_any_replica(replicas, tmp_path):
    a = TranslatedFiles(tmp_path / "a", 60, replicas().main)
    b = TranslatedFiles(tmp_path / "b", 60, replicas().main)
    name = a.save("report.docx", b"content")
    assert b.content(name) == b"content" and b.content("../../etc/passwd") is None
    b.ttl_s = 0.0
    assert b.content(name) is None and b.sweep() == 1


# --- migrations and reachability ----------------------------------------------------------------


def test_migrations_are_recorded_and_run_once(replicas):
    first = replicas().main
    GlossaryStore(first, 10).create("ui", "en", "de", [("a", "b")])
    second = replicas().main
    store = GlossaryStore(second, 10)  # opening again applies nothing, loses nothing
    assert [g.name for g in store.list()] == ["ui"]
    assert second.applied_versions("glossaries") == [1, 2]


def test_an_unreachable_database_is_a_503_and_a_reason_not_a_crash():
    from service.storage import postgres
    from tests.live_server import free_port

    database = postgres.PostgresDatabase(
        f"postgresql://nobody:secret@127.0.0.1:{free_port()}/none", connect_timeout_s=1.0
    )
    store = GlossaryStore(database, 10)
    try:
        with pytest.raises(StoreUnavailable) as refused:
            store.list()
        assert refused.value.status == 503 and "secret" not in refused.value.message
        reason = database.unreachable()
        assert reason is not None and "127.0.0.1" in reason and "secret" not in reason
    finally:
        database.close()


def test_requests_after_a_failed_attempt_are_refused_at_once():
    from service.storage import postgres
    from tests.live_server import free_port

    database = postgres.PostgresDatabase(
        f"postgresql://nobody@127.0.0.1:{free_port()}/none", connect_timeout_s=0.5
    )
    store = GlossaryStore(database, 10)
    try:
        with pytest.raises(StoreUnavailable):
            store.list()  # waits for the pool's attempts
        started = time.monotonic()
        for _ in range(5):
            with pytest.raises(StoreUnavailable):
                store.list()
        assert time.monotonic() - started < 1.0  # not 5 x the connect timeout (2.5 s)
    finally:
        database.close()
