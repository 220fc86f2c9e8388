"""Text a database column can hold, decided once for the engine.

PostgreSQL's text and jsonb refuse a NUL character, and no UTF-8 column takes a lone
surrogate (``"\\ud800"``). Input from callers is refused (``storable``), text the engine
writes itself, such as a handler's error, is cleaned (``clean``): a write that fails would
lose the outcome it carries.
"""

from __future__ import annotations

from typing import Any


def storable(text: str) -> bool:
    """Whether a text column of every supported database can hold ``text``."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clean(value: Any, limit: int) -> str:
    """``value`` as text any column can hold: cut to ``limit``, a NUL shown as ``\\x00``
    and what UTF-8 cannot encode replaced."""
    text = str(value)[:limit].replace("\x00", "\\x00")
    return text.encode("utf-8", "replace").decode("utf-8")
