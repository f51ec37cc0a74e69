"""The progress bar of a batch translation: characters translated, on stderr."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

# The progress bar shows only once a translation has taken this long.
PROGRESS_DELAY_S = 3.0


@dataclass
class Progress:
    """A tqdm bar on stderr counting characters, shown once the work takes a few seconds;
    totals grow as a file's texts are collected."""

    enabled: bool
    stream: TextIO | None = None
    bar: Any = field(default=None, init=False)

    def add(self, chars: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(
                total=0,
                unit="char",
                unit_scale=True,
                delay=PROGRESS_DELAY_S,
                file=self.stream or sys.stderr,
                dynamic_ncols=True,
            )
        self.bar.total += chars
        self.bar.refresh()

    def advance(self, chars: int) -> None:
        if self.bar is not None:
            self.bar.update(chars)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
