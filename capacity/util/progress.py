"""One progress line on stderr for the long commands (plan, validate, calibrate).

On a terminal the line is rewritten in place. When stderr is a file or a pipe (a CI log, `2> log`),
a counted phase prints one line per tenth of the way and at its end, and any other message one line,
so that logs stay readable instead of holding hundreds of carriage-return updates.
(`capacity sweep` uses tqdm's bar, which also resumes counts.)
"""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    def __init__(self, prefix: str, enabled: bool = True, stream: TextIO | None = None):
        self.prefix = prefix
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._shown: dict[str, int] = {}     # counted phase -> last tenth printed (off a terminal)
        self._open = False                   # a rewritten line awaits its newline (terminal)

    def update(self, label: str, done: int | None = None, total: int | None = None) -> None:
        """Report `label` (with `done` of `total` if the phase is counted)."""
        if not self.enabled:
            return
        text = f"{self.prefix}: {label}" + (f" {done}/{total}" if done is not None and total else "")
        if self.tty:
            print(f"\r{text}\033[K", end="", file=self.stream, flush=True)
            self._open = True
            return
        if done is not None and total:
            tenth = (10 * done) // total
            if tenth <= self._shown.get(label, -1) and done < total:
                return
            self._shown[label] = tenth
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """End the rewritten line on a terminal (nothing to do off a terminal)."""
        if self.enabled and self._open:
            print(file=self.stream, flush=True)
            self._open = False
