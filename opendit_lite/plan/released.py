"""Planning a config whose ``model.path`` (a released pipeline's ``transformer/`` folder) is not on this
machine: the planner needs only the architecture's numbers, which each family's record holds for its
released checkpoints (``releases`` in ``opendit_lite/families/<family>/__init__.py``, copied from each
release's ``transformer/config.json``).

A path is recognised by one of its folder names (the repository's name, as ``huggingface-cli download``
or ``git clone`` writes it); the plan says that it used the released numbers.
"""

import os
from typing import Optional

from ..families import Release, family_of


def released_config(path: Optional[str], class_name: str) -> Optional[Release]:
    """The release of family class ``class_name`` that a missing ``model.path`` names, if any; None when
    ``path`` exists or names no release of that class."""
    family = family_of(class_name)
    if not path or family is None or os.path.exists(os.path.join(path, "config.json")):
        return None
    parts = {p.lower() for p in os.path.normpath(path).split(os.sep)}
    return next((r for r in family.releases if r.name.lower() in parts), None)
