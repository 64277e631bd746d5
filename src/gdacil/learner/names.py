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
    (Unicode category ``Cc``: tabs, newlines, NUL, ...); invisible characters (line and
    paragraph separators, format characters such as bidirectional overrides, the byte-order
    mark and zero-width spaces), except the zero-width joiners that scripts and emoji need
    (:func:`_invisible`); names over :data:`MAX_NAME_LENGTH` characters.
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
    bad = _invisible(text)
    if bad is not None:
        raise ValueError(f"{where}: the class name {text[:40]!a} holds an invisible "
                         f"character (U+{ord(bad):04X} {unicodedata.name(bad, '')}), so it "
                         "could not be told apart from another name")
    if len(text) > MAX_NAME_LENGTH:
        raise ValueError(f"{where}: the class name is {len(text)} characters long (at most "
                         f"{MAX_NAME_LENGTH}): {text[:40]!r}...")
    return text


#: Zero-width non-joiner and joiner: part of the spelling of words in some scripts and of emoji
_JOINERS = frozenset("\u200c\u200d")


def _invisible(text: str) -> str | None:
    """The first character of ``text`` that shows nothing (Unicode categories ``Zl``, ``Zp``,
    ``Cf``), or None. A joiner is allowed where it changes how text renders, as in identifiers
    (Unicode UAX #31): after a virama, between two letters of a script other than Latin, Greek
    and Cyrillic, and between emoji."""
    for i, c in enumerate(text):
        if unicodedata.category(c) not in ("Zl", "Zp", "Cf"):
            continue
        before, after = text[i - 1] if i else "", text[i + 1] if i + 1 < len(text) else ""
        if c not in _JOINERS or not before or not after or not _joins(before, after):
            return c
    return None


def _joins(before: str, after: str) -> bool:
    if unicodedata.combining(before) == 9:  # a virama: the joiner picks the conjunct's form
        return True
    if all(unicodedata.category(x).startswith("L") and ord(x) >= 0x0590 for x in (before, after)):
        return True
    emoji = ("So", "Sk", "Mn")  # symbols, modifiers, the emoji variation selector
    return unicodedata.category(before) in emoji and unicodedata.category(after) == "So"
