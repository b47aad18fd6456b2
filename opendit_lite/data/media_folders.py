"""Datasets kept as folders of media and captions (``data.type: folder``), the layout LoRA trainers'
users keep: each image or clip beside a caption file of the same stem (``cat.png`` + ``cat.txt``),
and for image-to-video or edit training a control folder whose files, matched by stem, give each
row's conditioning image (the CSV's ``image`` column).

``data.path`` is one folder, or a list of entries mixed by repeats::

    data:
      type: folder
      path:
        - {path: /data/portraits, repeats: 3}                          # each file read 3 times per epoch
        - {path: /data/edits, caption_extension: .caption, control_path: /data/edits_before}

Entry keys: ``path`` (required), ``repeats`` (1), ``caption_extension`` (".txt"), ``control_path`` (a
folder, or a list of folders for pipelines that take several reference images: the n-th folder gives
each row's n-th image). ``read_media_folders`` turns them into the rows the CSV route reads
(``MediaRow``: media file, caption, conditioning images, where it came from), so buckets, latents
extraction and every check of the CSV route apply unchanged.

A media file without a caption file trains with the empty caption, after one warning naming the files
and their count (an error under ``data.require_captions``). A control file whose stem matches no media
file is an error naming it (a renamed or misplaced file would silently train without its image).
"""

import os
import sys
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple, Union

MEDIA_DATA_TYPES = ("csv", "folder")  # the data.type values read from captioned media files
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
VIDEO_FILES = (".mp4", ".mov", ".webm", ".mkv", ".avi", ".gif")
ENTRY_KEYS = ("path", "repeats", "caption_extension", "control_path")


class MediaRow(NamedTuple):
    """One training row: the media file, its caption, its conditioning image files, and where it came
    from (for messages: "line 7" of a CSV, or the media file)."""

    path: str
    caption: str
    images: Tuple[str, ...]
    where: str


class FolderEntry(NamedTuple):
    path: str
    repeats: int = 1
    caption_extension: str = ".txt"
    control_paths: Tuple[str, ...] = ()


def folder_entries(spec: Union[str, Sequence[Any]]) -> List[FolderEntry]:
    """``data.path`` of ``data.type: folder`` (a folder, or a list of folders / entry mappings) as
    checked entries; a ValueError saying what is wrong otherwise."""
    items = [spec] if isinstance(spec, str) else list(spec or [])
    if not items:
        raise ValueError("data.type=folder needs data.path: a folder of media files with same-named caption files, "
                         "or a list of {path, repeats, caption_extension, control_path} entries")
    entries = []
    for i, item in enumerate(items):
        item = {"path": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or "path" not in item:
            raise ValueError(f"data.path entry {i} is {item!r}: give a folder, or a mapping with at least 'path'")
        unknown = sorted(set(item) - set(ENTRY_KEYS))
        if unknown:
            raise ValueError(f"data.path entry {i} has unknown key(s) {', '.join(unknown)}; an entry takes "
                             f"{', '.join(ENTRY_KEYS)}")
        repeats = item.get("repeats", 1)
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"data.path entry {i}: repeats must be a positive integer, got {repeats!r}")
        extension = item.get("caption_extension", ".txt")
        if not isinstance(extension, str) or not extension:
            raise ValueError(f"data.path entry {i}: caption_extension must be a file extension such as '.txt'")
        extension = extension if extension.startswith(".") else "." + extension
        control = item.get("control_path") or ()
        control = (control,) if isinstance(control, str) else tuple(control)
        for folder in (item["path"], *control):
            if not isinstance(folder, str) or not os.path.isdir(folder):
                raise ValueError(f"data.path entry {i}: {folder!r} is not a folder")
        entries.append(FolderEntry(item["path"], repeats, extension, control))
    return entries


def _media_files(folder: str) -> Dict[str, str]:
    """stem -> media file of ``folder`` (not recursive; hidden files skipped); a ValueError on two media
    files of one stem (which caption would be whose?)."""
    files: Dict[str, str] = {}
    for name in sorted(os.listdir(folder)):
        stem, ext = os.path.splitext(name)
        if name.startswith(".") or ext.lower() not in IMAGE_EXTENSIONS + VIDEO_FILES:
            continue
        if stem in files:
            raise ValueError(f"{folder}: two media files share the stem {stem!r} ({os.path.basename(files[stem])}, "
                             f"{name}); rename one so each has its own caption file")
        files[stem] = os.path.join(folder, name)
    return files


def _read_caption(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return " ".join(f.read().split())
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}): save the caption as UTF-8") from None


def read_media_folders(spec: Union[str, Sequence[Any]], require_captions: bool = False) -> List[MediaRow]:
    """The rows of the folder dataset ``spec`` (``data.path``), each entry's files ``repeats`` times, in
    a fixed order (entries as listed, files by name)."""
    rows: List[MediaRow] = []
    uncaptioned: List[str] = []
    for entry in folder_entries(spec):
        media = _media_files(entry.path)
        if not media:
            kinds = ", ".join(IMAGE_EXTENSIONS + VIDEO_FILES)
            raise ValueError(f"{entry.path} holds no image or video files ({kinds})")
        controls = []
        for folder in entry.control_paths:
            found = _media_files(folder)
            unmatched = sorted(set(found) - set(media))
            if unmatched:
                shown = ", ".join(os.path.basename(found[s]) for s in unmatched[:5])
                raise ValueError(f"the control folder {folder} has {len(unmatched)} file(s) whose stem matches no "
                                 f"media file of {entry.path} (e.g. {shown}): rename them to their target's stem, "
                                 f"or remove them")
            controls.append(found)
        entry_rows = []
        for stem, path in media.items():
            caption_file = os.path.join(entry.path, stem + entry.caption_extension)
            if os.path.isfile(caption_file):
                caption = _read_caption(caption_file)
            else:
                caption = ""
                uncaptioned.append(path)
            images = tuple(found[stem] for found in controls if stem in found)
            entry_rows.append(MediaRow(path, caption, images, path))
        rows.extend(entry_rows * entry.repeats)
    if uncaptioned:
        shown = ", ".join(uncaptioned[:5]) + (f" and {len(uncaptioned) - 5} more" if len(uncaptioned) > 5 else "")
        if require_captions:
            raise ValueError(f"{len(uncaptioned)} media file(s) have no caption file ({shown}); write a caption "
                             f"beside each (same stem, the entry's caption_extension), or set "
                             f"data.require_captions=false to train them on the empty caption")
        print(f"warning: {len(uncaptioned)} media file(s) have no caption file and train on the empty caption: "
              f"{shown}. Write a caption beside each (same stem), or set data.require_captions=true to stop on "
              f"this.", file=sys.stderr)
    return rows
