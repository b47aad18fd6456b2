"""The errors a user can act on, and the exit code each one ends a script with.

This is the bottom of the package: it imports nothing of ``opendit_lite``, so any layer may raise
these. Other modules re-export them where users already import them (``opendit_lite.config.ConfigError``,
``opendit_lite.checkpoint.CheckpointError``, ``opendit_lite.parallelization.SequenceParallelError``, ...);
each class is defined here only.

    0    done
    2    bad input: a setting, a path, the data or a checkpoint, or a save that could not write (no
         room on some rank, or its partial folder removed); one paragraph says what and what to do
    3    a non-finite loss or weights: the run stopped, no checkpoint was written after the first bad step
    130  interrupted (Ctrl-C / SIGTERM); the checkpoint written at the stop lets auto_resume continue

``opendit_lite.utils.exit_codes.script_main`` turns them into that paragraph and code.
"""

EXIT_DONE, EXIT_BAD_INPUT, EXIT_NON_FINITE, EXIT_INTERRUPTED = 0, 2, 3, 130


class ConfigError(ValueError):
    """A configuration problem explained in one paragraph for the user."""


class SequenceParallelError(ConfigError):
    """Sequence parallelism was asked for (a group of more than one rank) but cannot apply."""


class BadDataError(ConfigError):
    """More samples failed to decode than ``max_bad_data_fraction`` allows."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, truncated or corrupted; the message names the file."""


class StorageError(RuntimeError):
    """A save could not write its files: the disk or a quota is full, a file-size limit was hit, the
    file system is read-only, or the partial folder disappeared while it was written. Every rank of a
    save raises the same one; the message names the folder, the rank and part that failed, and the
    bytes; complete checkpoints are kept."""


class RunLockedError(ConfigError):
    """Another live run holds the run folder's lock; the message names it."""


class NonFiniteError(RuntimeError):
    """The loss (or the weights) became NaN/inf; the message names the step."""


class RunInterrupted(Exception):
    """A stop signal was honoured: the run saved a checkpoint and ended before max_steps."""


# Exceptions a user can act on, and the exit code each maps to (checked in this order).
USER_ERRORS = ((ConfigError, EXIT_BAD_INPUT), (CheckpointError, EXIT_BAD_INPUT), (StorageError, EXIT_BAD_INPUT),
               (NonFiniteError, EXIT_NON_FINITE), (RunInterrupted, EXIT_INTERRUPTED),
               (KeyboardInterrupt, EXIT_INTERRUPTED))
