"""File modes of exported folders: diffusers' ``save_pretrained`` writes its weights through a
private temporary file (mode 0600) but its ``config.json`` as a plain file (0644 under the usual
umask 022), so an export shared with other users would have a config they can read and weights they
cannot. ``make_readable`` gives every file the mode a plain file gets (0666 less the umask)."""

import os


def _plain_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def make_readable(folder: str) -> str:
    """Give every file under ``folder`` the mode of a newly created plain file; returns ``folder``."""
    mode = _plain_file_mode()
    for root, _, files in os.walk(folder):
        for name in files:
            os.chmod(os.path.join(root, name), mode)
    return folder
