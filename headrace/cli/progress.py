"""Progress lines on a terminal (stderr), silent when not a TTY."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int, *, enabled: bool | None = None) -> None:
        self.label = label
        self.total = total
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0
        self._start = time.monotonic()

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.25 and done < self.total:
            return
        self._last = now
        rate = done / max(now - self._start, 1e-9)
        pct = 100.0 * done / self.total if self.total else 100.0
        sys.stderr.write(f"\r{self.label}: {done}/{self.total} ({pct:5.1f}%) {rate:,.0f}/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
