"""Translation memories: approved translations returned as they were approved, without the
model.

A memory holds approved segment pairs (source -> target) for one language pair. Clients post
them to a memory of their own (an id they choose: a project, a customer) or to the pair's
default memory (id ``default:en-de``), which every request of that pair uses unless it names
another memory or turns memories off. The text pipeline (service/text/pipeline.py) looks up
each text whole, then each of its sentences (with and without the markup at its edges); a
segment found is written exactly as approved, is not sent to the model, and is counted.

* **Matching** is exact after normalising whitespace: leading and trailing whitespace is
  ignored and every run of whitespace inside counts as one space. Case, punctuation and
  markup count: an approved translation is approved for that exact text.
* **Growing.** Posting a source a memory already holds replaces its target (the latest
  approval wins); within one post, one source with two different targets is refused, since
  which one was approved is not for the service to guess.
* **Storage.** Rows live in the service's database (service/storage/database.py: the
  SQLite file, or the PostgreSQL database every replica shares) and are written in one
  transaction per post, so a refused post changes nothing. A lookup is one indexed query: a
  memory of any size costs the process no memory, and a pair posted holds for the very next
  request, on every replica.
* **Owners.** ``owner_key`` is the API key id that created a memory (None: shared, as every
  memory is while keys are off; service/storage/owners.py). A key's memory, its pair
  default included, is stored as ``<owner_key>/<id>`` (an id a client chooses holds no ``/``):
  each key has its own ``default:en-de``, two keys may use one name, and a key's memories
  change only its own translations. A key reads its own memory of a name first, then the
  shared one; its requests use its own default and then the shared default. Another key's
  memory is 404 to it, a shared one read-only (403).
* **Which memories exist** is asked of the database once per pair default and owner, and
  kept until a memory is written: most requests come from owners who have no memory, and for
  them the lookup then costs no query. On SQLite every write (``add``, ``delete``) replaces a
  small file beside the database after its commit, and each lookup compares that file's
  identity (one ``stat``) with the one its answers were kept under, so a post through any
  process on the file holds for the next request in every other. On PostgreSQL nothing is
  kept: replicas on other machines share no file, and a notification (``LISTEN``) would
  reach them after the post's answer, so a request sent right after it could miss it; the
  one indexed query per request is the price of that guarantee.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

import regex

from service.errors import InputTooLarge, NotFound, TextError
from service.storage.database import Database
from service.storage.memory_presence import ExistingMemories
from service.storage.migrations import Migration
from service.storage.owners import Owner
from service.storage.session import Session
from service.text.plans import MemoryLookup

MIGRATIONS = [
    Migration(
        1,
        """
        CREATE TABLE memories (
            id TEXT PRIMARY KEY,
            source_lang TEXT NOT NULL,
            target_lang TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL
        );
        CREATE TABLE memory_entries (
            memory_id TEXT NOT NULL REFERENCES memories(id) ON DELETE CASCADE,
            source_key TEXT NOT NULL,
            source TEXT NOT NULL,
            target TEXT NOT NULL,
            PRIMARY KEY (memory_id, source_key)
        )
        """,
    ),
    Migration(2, "ALTER TABLE memories ADD COLUMN owner_key TEXT"),
]

# Ids clients choose; the defaults' ``default:en-de`` cannot collide with one (the colon).
_CLIENT_ID = regex.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DEFAULT_PREFIX = "default:"


class MemoryEntriesError(TextError):
    """Entries or a memory id the service cannot store as given (HTTP 400)."""


def segment_key(text: str) -> str:
    """What two spellings of one segment share: whitespace runs as one space, no whitespace
    at the ends."""
    return " ".join(text.split())


def default_memory_id(source_lang: str, target_lang: str) -> str:
    return f"{DEFAULT_PREFIX}{source_lang}-{target_lang}"


@dataclass(frozen=True)
class MemoryChoice:
    """Which memory a request uses: ``memory_id``, or its pair's default where there is one
    (``memory_id`` None); ``use=False``: none. ``owner_key``: whose memories it reads."""

    memory_id: str | None = None
    use: bool = True
    owner_key: str | None = None


def _stored_id(memory_id: str, owner_key: str | None) -> str:
    return f"{owner_key}/{memory_id}" if owner_key is not None else memory_id


PAIR_DEFAULT = MemoryChoice()
NO_MEMORY = MemoryChoice(use=False)


@dataclass(frozen=True)
class MemoryInfo:
    memory_id: str
    source_lang: str
    target_lang: str
    created_at: float  # seconds since the epoch
    updated_at: float
    entry_count: int
    owner_key: str | None = None  # the API key id that created it; None: shared

    @property
    def is_default(self) -> bool:
        return self.memory_id.startswith(DEFAULT_PREFIX)


@dataclass(frozen=True)
class MemoryUpdate:
    """What one post did: the memory as it is now, whether the post created it, and how many
    of its pairs were new and how many replaced an earlier target."""

    info: MemoryInfo
    created: bool
    added: int
    replaced: int


def check_entries(
    entries: Iterable[tuple[object, object]], max_chars: int
) -> list[tuple[str, str, str]]:
    """``(key, source, target)`` for each distinct pair; :class:`MemoryEntriesError` (400)
    or ``InputTooLarge`` (413) naming the first bad entry."""
    checked: dict[str, tuple[str, str, str]] = {}
    for index, (source, target) in enumerate(entries):
        for side, value in (("source", source), ("target", target)):
            if not isinstance(value, str) or not value.strip():
                raise MemoryEntriesError(
                    "empty_memory_segment", f"memory entry {index}: the {side} segment is empty"
                )
            if len(value) > max_chars:
                # A source longer than a request's text could never be matched.
                raise InputTooLarge(
                    "memory_segment_too_long",
                    f"memory entry {index}: the {side} segment has {len(value)} characters; "
                    f"the limit is MT_MAX_CHARS_PER_TEXT={max_chars}",
                )
        assert isinstance(source, str) and isinstance(target, str)
        key = segment_key(source)
        earlier = checked.get(key)
        if earlier is not None and earlier[2] != target:
            raise MemoryEntriesError(
                "conflicting_memory_entries",
                f"memory entry {index}: the source segment {source[:80]!r} is given twice with "
                "different targets",
            )
        checked[key] = (key, source, target)
    if not checked:
        raise MemoryEntriesError("empty_memory", "no memory entries were given")
    return list(checked.values())


class MemoryStore:
    def __init__(self, database: Database, max_chars: int) -> None:
        """``max_chars``: the longest segment (``MT_MAX_CHARS_PER_TEXT``)."""
        self.database = database
        database.add_migrations("memories", MIGRATIONS)
        self.max_chars = max_chars
        self.existing = ExistingMemories.beside(database)

    def add(
        self,
        memory_id: str | None,
        source_lang: str,
        target_lang: str,
        entries: Iterable[tuple[object, object]],
        owner_key: str | None = None,
    ) -> MemoryUpdate:
        """Store ``entries`` in ``memory_id`` (created if new) or, for None, in the pair's
        default memory. Refusals (bad entries, a bad id, a memory of another pair) raise
        before anything is written."""
        default_id = default_memory_id(source_lang, target_lang)
        memory_id = memory_id or default_id
        if memory_id != default_id and not _CLIENT_ID.fullmatch(memory_id):
            raise MemoryEntriesError(
                "invalid_memory_id",
                f"memory_id {memory_id[:80]!r}: 1 to 64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit",
            )
        rows = check_entries(entries, self.max_chars)
        public_id, memory_id = memory_id, _stored_id(memory_id, owner_key)
        now = time.time()
        with self.database.transaction() as db:
            # Insert-if-absent first: two replicas creating one memory at once both succeed.
            created = db.execute(
                "INSERT INTO memories (id, source_lang, target_lang, created_at, updated_at, "
                "owner_key) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (memory_id, source_lang, target_lang, now, now, owner_key),
            ).rowcount
            existing = db.execute(
                "SELECT source_lang, target_lang FROM memories WHERE id = ?", (memory_id,)
            ).fetchone()
            if tuple(existing) != (source_lang, target_lang):
                raise MemoryEntriesError(
                    "memory_language_mismatch",
                    f"the memory {public_id!r} is for {existing[0]}->{existing[1]}, the entries "
                    f"are for {source_lang}->{target_lang}",
                )
            db.execute("UPDATE memories SET updated_at = ? WHERE id = ?", (now, memory_id))
            held = _held_keys(db, memory_id, [key for key, _, _ in rows])
            db.executemany(
                "INSERT INTO memory_entries (memory_id, source_key, source, target) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (memory_id, source_key) "
                "DO UPDATE SET source = excluded.source, target = excluded.target",
                [(memory_id, key, source, target) for key, source, target in rows],
            )
        self.existing.changed()
        replaced = sum(key in held for key, _, _ in rows)
        info = self.info(public_id, owner_key)
        return MemoryUpdate(info, bool(created), len(rows) - replaced, replaced)

    def list(self, owner_key: str | None = None) -> list[MemoryInfo]:
        """The memories ``owner_key`` reads (its own and the shared ones; None: all)."""
        with self.database.read() as db:
            rows = db.execute(_INFO + " GROUP BY m.id ORDER BY m.created_at, m.id").fetchall()
        infos = [MemoryInfo(*row) for row in rows]
        return [
            _as_seen_by(info, owner_key)
            for info in infos
            if owner_key is None or info.owner_key in (None, owner_key)
        ]

    def _stored_info(self, stored_id: str) -> MemoryInfo | None:
        with self.database.read() as db:
            row = db.execute(_INFO + " WHERE m.id = ? GROUP BY m.id", (stored_id,)).fetchone()
        return MemoryInfo(*row) if row is not None else None

    def _resolve(self, memory_id: str, owner_key: str | None) -> MemoryInfo:
        """The stored memory ``owner_key`` means by ``memory_id``: its own, else the shared
        one; 404 when neither is (another key's memory is not found)."""
        candidates = [memory_id] if owner_key is None else []
        if owner_key is not None and "/" not in memory_id:
            candidates = [_stored_id(memory_id, owner_key), memory_id]
        for stored_id in candidates:
            info = self._stored_info(stored_id)
            if info is not None and (owner_key is None or info.owner_key in (None, owner_key)):
                return info
        raise NotFound(f"no translation memory with id {memory_id!r}", "memory_not_found")

    def info(self, memory_id: str, owner_key: str | None = None) -> MemoryInfo:
        return _as_seen_by(self._resolve(memory_id, owner_key), owner_key)

    def entries(
        self, memory_id: str, owner_key: str | None = None
    ) -> builtins.list[tuple[str, str]]:
        stored_id = self._resolve(memory_id, owner_key).memory_id  # 404, not an empty list
        with self.database.read() as db:
            rows = db.execute(
                "SELECT source, target FROM memory_entries WHERE memory_id = ? ORDER BY source_key",
                (stored_id,),
            ).fetchall()
        return [(source, target) for source, target in rows]

    def delete(self, memory_id: str, owner_key: str | None = None) -> None:
        """404 as :meth:`info`; ``ReadOnly`` (403) for a shared memory a key may only read."""
        info = self._resolve(memory_id, owner_key)
        Owner(owner_key).check_changes(info.owner_key, f"the translation memory {memory_id!r}")
        with self.database.transaction() as db:
            deleted = db.execute("DELETE FROM memories WHERE id = ?", (info.memory_id,)).rowcount
        self.existing.changed()
        if not deleted:
            raise NotFound(f"no translation memory with id {memory_id!r}", "memory_not_found")

    def lookup(
        self, choice: MemoryChoice, source_lang: str, target_lang: str
    ) -> MemoryLookup | None:
        """The lookup a request of ``source_lang``->``target_lang`` uses, or None: 404 for an
        unknown ``memory_id``, 400 for one of another pair (its segments are in the wrong
        language for this one)."""
        if not choice.use:
            return None
        if choice.memory_id is None:
            # The key's own default first, then the shared one: its own approvals win.
            default_id = default_memory_id(source_lang, target_lang)
            stored = [default_id]
            if choice.owner_key is not None:
                stored.insert(0, _stored_id(default_id, choice.owner_key))
            found = self.existing.which(self.database, stored)
            if not found:
                return None
        else:
            info = self._resolve(choice.memory_id, choice.owner_key)
            if (info.source_lang, info.target_lang) != (source_lang, target_lang):
                raise MemoryEntriesError(
                    "memory_language_mismatch",
                    f"the memory {choice.memory_id!r} is for {info.source_lang}->"
                    f"{info.target_lang}, the request is {source_lang}->{target_lang}",
                )
            found = [info.memory_id]
        return lambda text: next(
            (target for stored_id in found if (target := self._find(stored_id, text))), None
        )

    def _find(self, memory_id: str, text: str) -> str | None:
        key = segment_key(text)
        if not key:
            return None
        with self.database.read() as db:
            row = db.execute(
                "SELECT target FROM memory_entries WHERE memory_id = ? AND source_key = ?",
                (memory_id, key),
            ).fetchone()
        return row[0] if row is not None else None


_INFO = (
    "SELECT m.id, m.source_lang, m.target_lang, m.created_at, m.updated_at, COUNT(e.source_key), "
    "m.owner_key "
    "FROM memories m LEFT JOIN memory_entries e ON e.memory_id = m.id"
)


def _as_seen_by(info: MemoryInfo, owner_key: str | None) -> MemoryInfo:
    """``info`` with the id its owner knows it by (without the owner's prefix)."""
    if owner_key is None or info.owner_key != owner_key:
        return info
    return replace(info, memory_id=info.memory_id.removeprefix(f"{owner_key}/"))


def _held_keys(db: Session, memory_id: str, keys: list[str]) -> set[str]:
    """Which of ``keys`` the memory already holds (chunked: both back-ends cap a query's
    parameters)."""
    held: set[str] = set()
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        marks = ",".join("?" * len(chunk))
        held.update(
            key
            for (key,) in db.execute(
                f"SELECT source_key FROM memory_entries WHERE memory_id = ? "  # noqa: S608
                f"AND source_key IN ({marks})",
                (memory_id, *chunk),
            )
        )
    return held
