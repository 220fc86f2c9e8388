"""Text a database column can hold, decided once for the engine (JSON text included).

PostgreSQL's text and jsonb refuse a NUL character, and no UTF-8 column takes a lone
surrogate (``"\\ud800"``). Input from callers is refused (``storable``), text the engine
writes itself, such as a handler's error, is cleaned (``clean``): a write that fails would
lose the outcome it carries.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

# Most containers (objects, arrays) nested in a payload or in headers; a scalar is 0 deep,
# {"a": [1]} is 2. Deeper values fail elsewhere: PostgreSQL's jsonb parser past about
# 12,000 levels at the default max_stack_depth (2 MB; fewer with a smaller setting),
# Python's json module past about 1,500 (3.12), and a worker that could not decode a
# payload could never run its job. 100 is far inside all of them.
MAX_PAYLOAD_DEPTH = 100

# Not ASCII-escaped: PostgreSQL's jsonb gives text back unescaped too, and a lone surrogate
# stays raw, for the UTF-8 encode to find.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_encoders = threading.local()
NUL_PROBLEM = "contains a NUL character (\\x00), which PostgreSQL text cannot hold"
SURROGATE_PROBLEM = "contains a lone surrogate (U+D800 to U+DFFF), which UTF-8 cannot encode"
# The escape json.dumps writes for a NUL, not preceded by an odd run of backslashes: the
# JSON text \\u0000 is an escaped backslash followed by "u0000", which is no NUL.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# Outside its strings, json.dumps' compact output holds only brackets, separators, numbers
# and true/false/null: deleting those characters leaves the brackets, all of one kind.
_BRACKETS_ONLY = str.maketrans("{}", "[]", ",:0123456789+-.eEtrufalsn")


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


def _nested_deeper(text: str, limit: int) -> bool:
    """Whether json.dumps' compact ``text`` nests containers more than ``limit`` deep.

    Escapes removed (pairs of backslashes first: a run of them pairs from its left end), every
    quote left delimits a string, so the odd pieces of a split on it are the strings. Of the
    rest only brackets stay, and each round deletes every innermost pair (``str.replace``
    does not rescan what it joins): one round, one level. C-fast steps, no recursion.
    """
    if "\\" in text:
        text = text.replace("\\\\", "").replace('\\"', "")
    brackets = "".join(text.split('"')[::2]).translate(_BRACKETS_ONLY)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace("[]", "")
    return bool(brackets)


def _encode(value: Any) -> str:
    """``_ENCODER.encode(value)`` by the C encoder that ``encode`` would build at every call
    (building it was a large share of a small payload's encode). One per thread: its
    markers, the ids the circular-reference check is inside, belong to one call at a time,
    and a call that raised leaves its ids behind, so that encoder is dropped."""
    encoder: Callable[[Any, int], tuple[str, ...]] | None = getattr(_encoders, "encoder", None)
    if encoder is None:
        # None in an interpreter without the C module (typeshed does not declare it).
        make_encoder: Callable[..., Callable[[Any, int], tuple[str, ...]]] | None = getattr(
            json.encoder, "c_make_encoder", None)
        if make_encoder is None:
            return _ENCODER.encode(value)
        encoder = _encoders.encoder = make_encoder(
            {}, _ENCODER.default, json.encoder.encode_basestring, None,
            _ENCODER.key_separator, _ENCODER.item_separator, False, False, False)
    try:
        return "".join(encoder(value, 0))
    except BaseException:
        _encoders.encoder = None
        raise


def load_json(text: str | bytes) -> Any:
    """``json.loads``, with input nested too deep for the decoder (a form's hostile
    ``[[[[…``) refused as any other text that is not JSON: ``ValueError``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"nested more than MAX_PAYLOAD_DEPTH ({MAX_PAYLOAD_DEPTH}) deep"
                         ) from None


def json_text(value: Any, max_bytes: int | None = None) -> str:
    """``value`` as the JSON text to store; ``ValueError`` naming the problem if JSON,
    either database or a worker's decoder could not take it (callers name the field).

    A lone surrogate fails the UTF-8 encode the size needs anyway; a NUL and the depth
    are looked for only after C-fast tests say they may be there, so a common payload
    costs the C encoder and little more.
    """
    try:
        text = _encode(value)
    except RecursionError:  # far past the limit: the C encoder ran out of stack first
        raise ValueError(f"is nested more than MAX_PAYLOAD_DEPTH ({MAX_PAYLOAD_DEPTH}) deep"
                         ) from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"is not JSON-serialisable: {exc}") from None
    try:  # ASCII, the usual text, is its own size and cannot hold a surrogate
        size = len(text) if text.isascii() else len(text.encode())
    except UnicodeEncodeError:
        raise ValueError(SURROGATE_PROBLEM) from None
    if max_bytes is not None and size > max_bytes:
        raise ValueError(f"is {size} bytes, over MAX_PAYLOAD_BYTES ({max_bytes})")
    # A NUL is written as an escape, and most texts have no backslash at all (memchr).
    if "\\" in text and "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise ValueError(NUL_PROBLEM)
    # Too deep needs more than MAX_PAYLOAD_DEPTH openers, and as many closers after them.
    if (len(text) > 2 * MAX_PAYLOAD_DEPTH
            and text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH
            and _nested_deeper(text, MAX_PAYLOAD_DEPTH)):
        raise ValueError(f"is nested more than MAX_PAYLOAD_DEPTH ({MAX_PAYLOAD_DEPTH}) deep")
    return text
