"""Who owns a file a process left behind: this host's name and whether a process id is alive.

A run stamps its lock file and its temporary checkpoint folders with ``<pid>@<host>``; a later run
reads the stamp back to tell a live owner (leave it alone) from a dead one (take over, clean up).
Liveness is only knowable on the same host: a stamp from another host counts as alive.
"""

import errno
import os
import re
import socket
from typing import Optional, Tuple

_STAMP = re.compile(r"(\d+)@([^/@]+)")


def this_host() -> str:
    return socket.gethostname() or "localhost"


def owner_stamp() -> str:
    """``<pid>@<host>`` of this process."""
    return f"{os.getpid()}@{this_host()}"


def parse_stamp(text: str) -> Optional[Tuple[int, str]]:
    """``(pid, host)`` of a whole ``<pid>@<host>`` stamp, else None."""
    match = _STAMP.fullmatch(text)
    return (int(match.group(1)), match.group(2)) if match else None


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (a zombie counts as gone)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM  # exists, owned by another user
    try:  # a zombie (killed, not yet reaped by its parent) holds nothing any more
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def owner_alive(pid: int, host: str) -> bool:
    """Whether the owner ``pid@host`` may still be running: alive here, or on another host (unknowable)."""
    return host != this_host() or pid_alive(pid)
