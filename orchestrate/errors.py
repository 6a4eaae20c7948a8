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
