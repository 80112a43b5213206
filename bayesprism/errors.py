"""Exception and warning types.

Every error raised on bad input names the file, the field and the offending value, so the CLI
can print one line per problem and exit 2 without a traceback.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One problem found in an input: where it is, which field, what is wrong.

    Parameters
    ----------
    source
        File path (or a description such as ``"table"``) the problem was found in.
    field
        Column, JSON key or argument name.
    message
        What is wrong, in plain words.
    count
        How many rows/events share the problem (0 when not countable).
    example
        One offending value, rendered with ``repr``-like clarity (``e.g.`` one of ``count``
        values, else ``got`` the value).
    """

    source: str
    field: str
    message: str
    count: int = 0
    example: object = None

    def __str__(self) -> str:
        where = f"{self.source}: {self.field}" if self.field else self.source
        text = f"{where}: {self.message}"
        if self.count:
            text += f" ({self.count} row{'' if self.count == 1 else 's'})"
        if self.example is not None:
            example = self.example.item() if hasattr(self.example, "item") else self.example
            # one of several offending values, or the one value given
            text += f", {'e.g.' if self.count > 1 else 'got'} {example!r}"
        return text


class BayesPrismError(Exception):
    """Base class of every error raised by bayesprism on purpose."""


class InputError(BayesPrismError, ValueError):
    """Bad user input: carries every problem found, not just the first."""

    def __init__(self, problems: Problem | str | Iterable[Problem | str]):
        if isinstance(problems, (Problem, str)):
            problems = [problems]
        self.problems: list[Problem | str] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def lines(self) -> list[str]:
        """One printable line per problem."""
        return [str(p) for p in self.problems]


class TraceFormatError(InputError):
    """A trace or log file cannot be parsed (truncated, invalid JSON, missing keys...)."""


class TableValidationError(InputError):
    """A trace table violates the schema (``bayesprism.schema``)."""


class SpecError(InputError):
    """A model specification is invalid."""


class PlanError(InputError):
    """A parallel plan or cluster description is impossible or inconsistent."""


class ArtifactError(InputError):
    """A saved posterior/forecast cannot be loaded (wrong schema, spec, or corrupt file)."""


class IngestWarning(UserWarning):
    """Something was skipped or guessed during ingestion."""


class ConvergenceWarning(UserWarning):
    """A fit has divergences, R-hat above the threshold, or too few effective draws."""


class ArtifactWarning(UserWarning):
    """A saved artifact was written by another bayesprism version (read, but said)."""


def renamed_keyword(function: str, new: str, new_value, old: str, old_value, default):
    """The value of a keyword renamed for one release: ``new_value``, else ``old_value`` with a
    ``FutureWarning`` (the old name goes in the next release), else ``default``.

    Raises
    ------
    InputError
        If both names are given.

    Examples
    --------
    >>> renamed_keyword("simulate", "random_seed", 3, "seed", None, 0)
    3
    """
    if old_value is None:
        return default if new_value is None else new_value
    if new_value is not None:
        raise InputError(Problem(function, old, f"give {new!r} only (the new name of {old!r})",
                                 example=old_value))
    warnings.warn(f"{function}(): {old!r} is now {new!r}; the old name goes in the next "
                  "release", FutureWarning, stacklevel=3)
    return old_value

