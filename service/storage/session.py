"""A connection as the stores use it: SQL written once, with ``?`` placeholders, in the subset
both back-ends speak (``INSERT ... ON CONFLICT ... DO UPDATE``, ``RETURNING``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Session:
    """A connection as the stores use it: SQL with ``?`` placeholders, on either back-end."""

    def __init__(self, connection: Any, placeholder: str) -> None:
        self.connection = connection
        self._placeholder = placeholder

    def _sql(self, sql: str) -> str:
        return sql if self._placeholder == "?" else sql.replace("?", self._placeholder)

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor:
        cursor: Cursor = self.connection.execute(self._sql(sql), tuple(params))
        return cursor

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        rows = [tuple(row) for row in rows]
        if not rows:
            return
        if self._placeholder == "?":
            self.connection.executemany(sql, rows)
        else:
            with self.connection.cursor() as cursor:
                cursor.executemany(self._sql(sql), rows)
