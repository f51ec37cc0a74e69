"""Whose stored glossaries, memories and document jobs a request sees.

With API keys on, what a key stores belongs to that key (its ``owner_key``, a hash of the key,
never the key itself): another key is told 404, its lists leave it out, and a memory changes
only its owner's translations. What is stored without an owner (``owner_key`` None) is shared:
every key reads and uses it, and only the shared space's writers change it. Keys off, and the
operator's admin keys (``MT_ADMIN_API_KEYS``), write the shared space and see everything.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from service.errors import ServiceError


class ReadOnly(ServiceError):
    """A shared item this key may read but not change (HTTP 403)."""

    status = 403
    default_code = "read_only"


@dataclass(frozen=True)
class Owner:
    """``key``: the ``owner_key`` of what this client stores; None: the shared space (keys
    off, or an admin key), which sees and changes everything."""

    key: str | None = None

    def check_changes(self, owner_key: str | None, what: str) -> None:
        """:class:`ReadOnly` for an item this client may only read."""
        if self.key is not None and owner_key != self.key:
            raise ReadOnly(f"{what} is shared and read-only for this API key")


SHARED = Owner()


def key_owner(key: str) -> Owner:
    """The owner of what a (non-admin) API key stores."""
    return Owner("key-" + hashlib.sha256(key.encode()).hexdigest()[:32])
