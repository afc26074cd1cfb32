"""One exception type for every problem the user can fix.

The CLI turns a :class:`UserError` into one line on stderr and exit code 2; anything else is a bug.
"""
from __future__ import annotations


class UserError(Exception):
    """Bad input: unknown name, missing/corrupt file, invalid value. The message is one line with the fix."""

    exit_code = 2
