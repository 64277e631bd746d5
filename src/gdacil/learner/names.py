"""Class names: what a label may be, and the one spelling a class is known by.

Every path that takes a class name (``learn`` with labels in memory, CSV/JSON label columns,
``forget``, the HTTP server) goes through :func:`class_name`, so ``"café"`` typed with a
combining accent (NFD) and with a precomposed ``é`` (NFC) are one class, and ``3``, ``np.int64(3)``
and ``"3"`` are the class ``"3"``.
"""

from __future__ import annotations

import numbers
import unicodedata

__all__ = ["MAX_NAME_LENGTH", "class_name"]

#: Longest class name accepted, in characters (after normalisation).
MAX_NAME_LENGTH = 200


def class_name(value, where: str) -> str:
    """``value`` as a class name, or a ``ValueError`` naming ``where`` (e.g. ``"labels[3]"``,
    ``"tickets.csv, line 7"``).

    Accepted: strings, and integers (Python ``int`` but not ``bool``, NumPy integers), which
    become their decimal string. Strings are normalised to Unicode NFC and stripped of
    surrounding whitespace. Refused: ``None``, floats (NaN included), bytes, ``bool`` and any
    other type; empty names; lone surrogates (not encodable as UTF-8); control characters
    (Unicode category ``Cc``: tabs, newlines, NUL, ...); names over :data:`MAX_NAME_LENGTH`
    characters.
    """
    if isinstance(value, str):
        text = value
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):  # NumPy ints too
        text = str(int(value))
    else:
        kind = type(value).__name__
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise ValueError(f"{where}: a class name must be a string or an integer; got "
                         f"{kind} {shown}")
    bad = next((c for c in text if 0xD800 <= ord(c) <= 0xDFFF), None)
    if bad is not None:
        raise ValueError(f"{where}: the class name holds a lone surrogate ({bad!a}), which "
                         "is not valid Unicode text")
    text = unicodedata.normalize("NFC", text).strip()
    if not text:
        raise ValueError(f"{where}: empty label (a class name cannot be empty)")
    bad = next((c for c in text if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise ValueError(f"{where}: the class name {text[:40]!a} holds a control character "
                         f"({bad!a})")
    if len(text) > MAX_NAME_LENGTH:
        raise ValueError(f"{where}: the class name is {len(text)} characters long (at most "
                         f"{MAX_NAME_LENGTH}): {text[:40]!r}...")
    return text
