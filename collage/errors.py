"""The errors a user of collage may see, each a message that says what to change.

They live here, below every stage, so that any stage can raise them without importing the
stages above it."""


class OptimizeError(Exception):
    """The model cannot be optimized as given; the message says what to change."""


class PlacementFileError(OptimizeError):
    """A saved placement cannot be read, or was made for another model."""


def first_line(err: Exception) -> str:
    """The first line of ``err``'s message: what a one-line reason shows of it."""
    text = str(err).strip()
    return text.splitlines()[0] if text else "(no message)"

