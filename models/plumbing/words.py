"""How reports name things: a model's name in a figure's title, the target positions an average runs over. Strings
only (no torch)."""

from __future__ import annotations

import os


def title_name(name: str | None) -> str:
    """A model's name as a figure's title shows it: a path by its last part (a user's path would fill the line),
    its bytes that are not UTF-8 escaped (``ck\\xff``: matplotlib draws text, not bytes): ``Result.title``."""
    name = str(name or "model").rstrip("/")
    short = name.rsplit("/", 1)[-1] or name
    return os.fsencode(short).decode("utf-8", "backslashreplace")


def positions_words(chosen: str, trained_on: str) -> str:
    """``over the last token (the positions it was trained on)``: for a summary."""
    which = "the last token" if chosen == "last" else "every target position h >= 1"
    trained = "the last token" if trained_on == "last" else "every position"
    why = "the positions it was trained on" if chosen == trained_on else f"chosen with --positions; trained on {trained}"
    return f"over {which} ({why})"
