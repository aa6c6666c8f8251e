"""Exit codes of the node programs and the errors behind them (one per kind of failure)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1          # unexpected error (logged without traceback)
EXIT_BAD_CONFIG = 2        # node config missing / invalid, or bad command line
EXIT_OVERSUBSCRIBED = 3    # start refused: the device's memory or compute would be oversubscribed
EXIT_BAD_AD = 4            # job ad or machine ad malformed / hostile
EXIT_NO_STATE = 5          # the node agent is unreachable, or its state dir unsafe or taken


class AdError(ValueError):
    """A ClassAd (job or machine) is malformed or carries a hostile value; names the attribute."""


class ConfigError(ValueError):
    """The node config JSON or a command-line option is missing or invalid."""


class StateError(OSError):
    """The node agent's state dir or socket is missing, unsafe or unusable."""


class Refused(Exception):
    """A start the node agent refuses; ``code`` is the hook's exit code (3: full, 5: retry)."""

    def __init__(self, code: int, message: str, job: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.job = job
