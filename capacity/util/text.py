"""Text helpers for messages: `quote` keeps an echoed user value short."""

from __future__ import annotations

from typing import Any


def quote(value: Any, limit: int = 100) -> str:
    """`value` as one line of at most `limit` characters (longer ones cut, saying how long they were)."""
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\n", "\\n").replace("\r", "\\r")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"
