"""User errors: an input or a setting the project refuses, as opposed to a bug.

``python -m gem`` prints a user error as one or two lines naming the input and the rule
it breaks, and exits 2; a traceback only with ``--debug`` (or ``GEM_DEBUG=1``). Any other
exception is a bug and keeps its traceback. A library error class that is a user error
inherits from ``UserError`` as well as from the builtin it always was (``ValueError``...),
so callers that catch the builtin are unchanged.

A failure of the machine (a full disk or quota, the file size limit, a read-only file
system, a locked or unreachable store) is neither: ``machine_failure`` turns it into one
line naming the resource and what to do, and ``python -m gem`` exits 1 (a run that
failed) with that line, not a traceback (again: ``--debug`` shows it). A command that
meets one leaves nothing half-written that a rerun would trust.
"""

from __future__ import annotations

import errno
import os
import re

EXIT_USER_ERROR = 2  # the same code argparse gives a bad option


class UserError(Exception):
    """Raised for a refused input or setting; its message says which, and the rule."""


class UsageError(UserError, ValueError):
    """Options that do not go together, or one that is missing."""


# files that are not there are the user's to give: refused like a UserError
_REFUSED_BUILTINS = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


def is_user_error_class(cls: type) -> bool:
    """Whether exceptions of ``cls`` are refusals of an input or setting (UserError and
    its subclasses, a file that is not there)."""
    return isinstance(cls, type) and issubclass(cls, (UserError, *_REFUSED_BUILTINS))


def is_user_error(exc: BaseException) -> bool:
    """A refused input or setting, not a bug: gem's UserError classes (every layer's
    refusals derive from it: a window, a dataset, a surface, an output folder refused), a
    file that is not there, an MLflow registry name or alias that does not exist."""
    import sys

    if is_user_error_class(type(exc)):
        return True
    mlflow_errors = sys.modules.get("mlflow.exceptions")  # only loaded when mlflow was
    return (mlflow_errors is not None and isinstance(exc, mlflow_errors.MlflowException)
            and getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"))


# -- failures of the machine, not of the input or of the code ------------------------------

EXIT_MACHINE = 1  # a run that failed; without a traceback when the machine is the cause

# errno -> what ran out
_NO_SPACE = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exhausted"}


class MachineError(Exception):
    """The machine failed a run (a full disk, the file size limit, a read-only or locked
    store): the message names the resource and what to do. The run's outputs were left
    unfinished or removed, never finished-looking."""


def _errno_of(exc: BaseException) -> int | None:
    """The errno of an OSError, also when a library (pyarrow) only wrote it in the text."""
    if not isinstance(exc, OSError):
        return None
    if exc.errno:
        return exc.errno
    match = re.search(r"\[errno (\d+)\]", str(exc), re.IGNORECASE)
    return int(match.group(1)) if match else None


def machine_failure(exc: BaseException, where: str | None = None) -> str | None:
    """One line naming the resource that failed and what to do, when ``exc`` (or an
    exception it was raised from) is a failure of the machine; None otherwise (an input
    refused, or a bug). ``where``: the folder the command was writing, when known."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MachineError):
            return str(exc)
        code = _errno_of(exc)
        name = getattr(exc, "filename", None) or where
        at = f"{name}: " if name else ""
        if code in _NO_SPACE:
            return f"{at}{_NO_SPACE[code]}{_free_space(name)}; free space on that disk (or write elsewhere), then rerun"
        if code == errno.EFBIG:
            return (f"{at}file too large: the file size limit of this process was reached (ulimit -f: "
                    f"{_file_size_limit()}); raise it (ulimit -f unlimited) or write less, then rerun")
        if code == errno.EROFS:
            return f"{at}read-only file system; write the output to a writable folder"
        text = str(exc)
        sqlite = type(exc).__module__.split(".")[0] in ("sqlite3", "sqlalchemy", "mlflow")
        if sqlite and "database is locked" in text:
            return ("the SQLite store is locked by another process (database is locked); wait for it to finish, "
                    "or give this run its own store (another --workspace or MLFLOW_TRACKING_URI), then rerun")
        if sqlite and ("disk I/O error" in text or "database or disk is full" in text):
            return (f"{at}a SQLite store could not be written (disk I/O error): the disk is full{_free_space(where)} "
                    f"or the file size limit was reached (ulimit -f: {_file_size_limit()}); free space or raise "
                    "the limit, then rerun")
        if type(exc).__name__ == "TrackingUnavailable":  # gem.tracking: its message names the URI and the way on
            return text
        exc = exc.__cause__ or exc.__context__
    return None


def _free_space(path: str | None) -> str:
    probe = str(path or ".")
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        stat = os.statvfs(probe or ".")
    except OSError:
        return ""
    return f" ({stat.f_bavail * stat.f_frsize / 2**20:,.0f} MiB free there)"


def _file_size_limit() -> str:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft:,} bytes"
