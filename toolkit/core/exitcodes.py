"""Exit codes shared by every ``dsv4kit`` command, so scripts can tell failures apart.

Importable without the CLI dependencies.
"""

OK = 0
#: The work ran and found a problem: a failed validation case, an invalid bench point, a regression.
CHECK_FAILED = 1
#: Bad input: an unknown option value, a malformed inventory, a missing file. Nothing was run.
USAGE = 2
#: The remote host could not be reached, refused the credentials, or its host key did not verify.
UNREACHABLE = 3
#: A remote or local command ran past its timeout and was killed.
TIMEOUT = 4
#: The target environment is missing something: no Python or venv, GPU absent, SGLang absent.
ENVIRONMENT = 5
#: A tool we drive (ansible-playbook, the bench client) failed; its own error text is shown.
TOOL_FAILED = 6
#: A comparison could not reach a verdict: too few valid repetitions, or noise too large to tell
#: (``records compare``, ``bench --baseline``). Never read as "no regression".
INCONCLUSIVE = 7
#: Interrupted by the user (Ctrl-C); nothing half-written was left behind.
INTERRUPTED = 130


class Abort(Exception):
    """Stop a command with one of the exit codes above and a message for the user."""

    def __init__(self, exit_code: int, message: str):
        super().__init__(message)
        self.exit_code = exit_code
