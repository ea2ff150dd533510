"""How a count reads wherever a person reads it (a command's output, a report, a page): "1
night", "2 nights", "0 entries", in one place rather than "1 nights" here and a hand-made
``'s' if n != 1`` there. The dashboard's and the report's templates have it as the filter
``counted``: ``{{ n|counted("night") }}``."""

from __future__ import annotations

# Nouns whose plural no rule below makes.
_IRREGULAR = {"series": "series", "child": "children", "person": "people", "this": "these"}


def plural(noun: str) -> str:
    """The plural of an English ``noun`` (its last word, for a phrase: "test case" -> "test
    cases", "run folder" -> "run folders")."""
    head, sep, last = noun.rpartition(" ")
    if last in _IRREGULAR:
        word = _IRREGULAR[last]
    elif last.endswith("y") and last[-2:-1] not in tuple("aeiou"):
        word = last[:-1] + "ies"  # entry -> entries, but day -> days
    elif last.endswith(("s", "x", "z", "ch", "sh")):
        word = last + "es"  # process -> processes, match -> matches
    else:
        word = last + "s"
    return head + sep + word


def counted(n: float, noun: str, plural_form: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is exactly 1: "1 night", "3 nights", "0 entries",
    "1.5 days". ``plural_form`` where the rule does not know the word."""
    number = f"{n:g}" if isinstance(n, float) else str(n)
    return f"{number} {noun if n == 1 else plural_form or plural(noun)}"


# Units a size may be written in, the largest first: the one definition a config's and a
# catalog's sizes ("64 MiB", "4 GiB") are read and said by.
SIZE_UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024), ("B", 1))


def parse_size(value: object) -> int:
    """A size as a person writes it: a number of bytes, or a number with GiB, MiB, KiB or B
    ("64 MiB"); ValueError saying so for anything else."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    text = value.strip() if isinstance(value, str) else ""
    factor = 1
    for unit, scale in SIZE_UNITS:
        if text.endswith(unit):
            text, factor = text[: -len(unit)].strip(), scale
            break
    if not text.isdigit():
        raise ValueError('not a size: give a number of bytes, or a number with KiB, MiB or GiB, e.g. "64 MiB"')
    return int(text) * factor


def size_text(n: int) -> str:
    """A size as parse_size reads it, in the largest unit it is a whole number of: "4 GiB"."""
    for unit, scale in SIZE_UNITS:
        if n and n % scale == 0:
            return f"{n // scale} {unit}" if unit != "B" else f"{n} bytes"
    return f"{n} bytes"
