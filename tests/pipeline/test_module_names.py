"""No two modules of the package share a file name unless they are the same concept in parallel
places: a repeated name must be in ``ALLOWED`` with the reason it repeats. A module named like an
unrelated one elsewhere reads as the same thing and sends a reader (or an import) to the wrong file."""

import os
from collections import defaultdict

import opendit_lite

PACKAGE_DIR = os.path.dirname(os.path.abspath(opendit_lite.__file__))
SKIP = {"__init__.py", "__main__.py"}
FAMILY_PIECE = "one piece of a diffusers family, the same piece in every families/<family>/ folder"

# file name -> why it may repeat (every folder holding it).
ALLOWED = {
    "registry.py": "each package's name-keyed registry with its register_* (conversions, schedulers, models, "
                   "families)",
    "image.py": "the image variant of three parallel things: its builders, its trainer spec, its sampling run",
    "video.py": "the video variant of three parallel things: its builders, its trainer spec, its sampling run",
    "sequence.py": "the sequence split/gather markers: serial identities (models/layers) and their "
                   "sequence-parallel versions (parallel)",
    "adapter.py": FAMILY_PIECE,
    "sp_spec.py": FAMILY_PIECE,
    "fused_norms.py": FAMILY_PIECE,
    "encoding.py": FAMILY_PIECE,
    "conditioning.py": FAMILY_PIECE,
    "tiny.py": FAMILY_PIECE,
    "step_cache.py": FAMILY_PIECE,
    "original_lora.py": FAMILY_PIECE + " (optional: the families with an original checkpoint layout)",
    "conditioning_i2v.py": "the conditioning of a family's image-to-video pipeline (a variant piece), the same piece "
                           "in every family that has one",
}


def repeated_names():
    """file name -> the package-relative paths of the modules with that name, for names used twice or more."""
    found = defaultdict(list)
    for dirpath, dirnames, files in os.walk(PACKAGE_DIR):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in files:
            if name.endswith(".py") and name not in SKIP:
                found[name].append(os.path.relpath(os.path.join(dirpath, name), PACKAGE_DIR))
    return {name: sorted(paths) for name, paths in found.items() if len(paths) > 1}


def test_repeated_module_names_are_the_same_concept_in_parallel_places():
    unexplained = {name: paths for name, paths in repeated_names().items() if name not in ALLOWED}
    assert not unexplained, (f"modules sharing a file name: {unexplained}; rename them to say what each holds, or "
                             f"add the name to ALLOWED with why it is the same concept in parallel places")


def test_every_allowed_name_still_repeats():
    stale = sorted(set(ALLOWED) - set(repeated_names()))
    assert not stale, f"ALLOWED lists names that no longer repeat: {stale}; remove them"
