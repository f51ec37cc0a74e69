"""The one error of ``python -m service models``: a sentence for the user, never a traceback."""

from __future__ import annotations


class ModelsError(Exception):
    """A pull, update or removal that cannot go on; the message says why and what to do."""
