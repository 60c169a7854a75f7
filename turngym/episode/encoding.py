"""Episodes as JSON text: the one encoding every writer and reader shares, so a line reads back as it was written.

Lone surrogates (text no UTF-8 can hold) are escaped, paired ones pass through ``surrogatepass``; the field
helpers walk a record's fields without the deep copy of :func:`dataclasses.asdict`.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
from typing import Any

# A surrogate code point that is not the first or second half of an adjacent high+low pair.
_LONE_SURROGATE = re.compile("[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def fields_of(obj: Any) -> dict[str, Any]:
    """A dataclass instance's fields, in order, not copied."""
    names = _FIELD_NAMES.get(type(obj))
    if names is None:
        names = _FIELD_NAMES[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
    return {name: getattr(obj, name) for name in names}


_PLAIN = frozenset({str, int, float, bool, type(None)})


def plain_json(value: Any) -> bool:
    """Whether ``value`` is JSON that :func:`json.dumps` writes without fail, by its types alone: str, bool,
    None, float, an int within the interpreter's digit limit for int-to-text (fewer than 3 bits a digit), and
    lists, tuples and str-keyed dicts of these. False means only "not shown here" (a subclass, another key
    type): dump it to know."""
    kind = type(value)
    if kind is str or kind is bool or kind is float or value is None:
        return True
    if kind is int:
        limit = sys.get_int_max_str_digits()  # 0: no limit
        return limit == 0 or value.bit_length() < 3 * limit
    if kind is dict:
        return all(type(k) is str and plain_json(v) for k, v in value.items())
    if kind is list or kind is tuple:
        return all(plain_json(v) for v in value)
    return False


def json_copy(value: Any) -> Any:
    """``value`` as :func:`dataclasses.asdict` would give it (records as dicts, containers copied, so the copy
    shares no container with ``value``), in one pass over JSON-shaped data; anything else is deep-copied."""
    if type(value) in _PLAIN:
        return value
    if type(value) is dict:
        return {k: v if type(v) in _PLAIN else json_copy(v) for k, v in value.items()}
    if type(value) is list or type(value) is tuple:
        items = [v if type(v) in _PLAIN else json_copy(v) for v in value]  # token ids: no call per id
        return items if type(value) is list else tuple(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_copy(fields_of(value))
    return copy.deepcopy(value)


def record_fields(obj: Any) -> dict[str, Any]:
    """``json.dumps``' fallback for the records inside an episode (turns, truth values): their fields."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return fields_of(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def escape_surrogates(text: str) -> str:
    """JSON text with every lone surrogate written as a ``\\udXXX`` escape, which JSON readers turn
    back into the same code point; the line stays valid UTF-8.

    A high surrogate followed by a low one cannot be escaped that way (JSON readers join the two
    escapes into one character), so such a pair stays raw and is written with ``surrogatepass``
    (:func:`encode_line`) and read back with it (:func:`decode_line`): every string reads back
    identically.
    """
    if utf8_encodable(text):  # the common case, checked in C (the regex scan was 5% of a busy client)
        return text
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def utf8_encodable(text: str) -> bool:
    """Whether ``text`` holds no surrogate code point (only those stop UTF-8 encoding); ASCII text at once."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encode_line(text: str) -> bytes:
    return (text + "\n").encode("utf-8", "surrogatepass")


def decode_line(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


def known_fields(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in d
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
    ]
    if missing:
        raise ValueError(f"{cls.__name__} record lacks required field(s) {missing}")
    return {k: v for k, v in d.items() if k in names}
