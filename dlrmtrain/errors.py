"""Problems the user can fix before training starts (a run directory that holds
another run, a checkpoint trained with another config, data too small for one
step). Every rank raises the same one; the entry point prints it once and exits 2."""


class SetupError(RuntimeError):
    """A run cannot start as configured; the message says why and what to change."""
