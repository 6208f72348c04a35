"""User errors: an input or a setting the project refuses, as opposed to a bug.

``python -m gem`` prints a user error as one or two lines naming the input and the rule
it breaks, and exits 2; a traceback only with ``--debug`` (or ``GEM_DEBUG=1``). Any other
exception is a bug and keeps its traceback. A library error class that is a user error
inherits from ``UserError`` as well as from the builtin it always was (``ValueError``...),
so callers that catch the builtin are unchanged.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2  # the same code argparse gives a bad option


class UserError(Exception):
    """Raised for a refused input or setting; its message says which, and the rule."""


class UsageError(UserError, ValueError):
    """Options that do not go together, or one that is missing."""
