"""Errors a user can cause, as one exception family.

Every error the CLI turns into a one-line message and exit code 2 derives from
:class:`OrchestrateError`.  Anything else escaping is a bug in orchestrate.
"""

from __future__ import annotations


class OrchestrateError(Exception):
    """Base class of every error orchestrate reports to its user."""


class InputError(OrchestrateError):
    """A bad file, option, shape or input value."""


class UnsupportedError(OrchestrateError):
    """An op type, attribute value or dtype that has no decomposition.

    ``items`` lists each unsupported thing once with the number of nodes that
    hit it, so a whole model's gaps are reported at once.
    """

    def __init__(self, message: str, items: dict[str, int] | None = None):
        super().__init__(message)
        self.items = dict(items or {})


class GraphError(OrchestrateError):
    """A primitive graph that breaks an IR rule (shapes, dtypes, ordering)."""


def check_format(
    found, current: str, older: dict[str, str], source: str, what: str, redo: str
) -> None:
    """Refuse a file of another format than ``current``: an older one names
    what it lacks (``older``) and what to ``redo``; anything else is not ``what``."""
    if not isinstance(found, str):
        raise InputError(f"{source}: not an orchestrate {what} (expected format {current!r})")
    if found in older:
        raise InputError(
            f"{source}: written by an older orchestrate (format {found!r}, without "
            f"{older[found]}); {redo}"
        )
    if found != current:
        raise InputError(f"{source}: not an orchestrate {what} (expected format {current!r})")
