"""The README and docs/ stay honest: generated pages equal what their generators write, every relative link
(and its #anchor) resolves, and every command in a ``bash`` block names a script, module, make target
and config file that exist, with flags its parser declares and config keys its schema holds. Flags are read from the
scripts' source (``add_argument("--flag", ...)``), not by running them, so the whole file takes about a second.
"""

import ast
import glob
import os
import re
import shlex
from typing import Dict, Iterator, List, Set, Tuple

import pytest
import yaml

from opendit_lite.config import reference_page
from opendit_lite.config.loader import all_keys
from opendit_lite.config.schema import ALIASES, TrainConfig
from opendit_lite.config.video_schema import VideoTrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))

# The scripts that read a config (parse_cli): their options, and the schema whose key=value they take.
CONFIG_OPTIONS = {"--config", "--debug", "--help", "-h"}
IMAGE_KEYS = set(all_keys(TrainConfig)) | set(ALIASES)
VIDEO_KEYS = set(all_keys(VideoTrainConfig)) | set(ALIASES)
CONFIG_SCRIPTS = {
    "train.py": IMAGE_KEYS | VIDEO_KEYS,   # the image trainer, or the video one for a Flux / SD3 pipeline
    "sample.py": IMAGE_KEYS | VIDEO_KEYS,
    "train_video.py": VIDEO_KEYS,
    "sample_video.py": VIDEO_KEYS,
    "opendit_lite/evaluate/__main__.py": IMAGE_KEYS,
}
SHELL_WORDS = {"then", "else", "do", "if", "time", "exec"}


def rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def prose_and_blocks(text: str) -> Tuple[str, List[Tuple[str, str]]]:
    """The text outside fenced blocks, and each block as (language, body)."""
    prose, blocks, lang, body = [], [], None, []
    for line in text.split("\n"):
        if line.startswith("```"):
            if lang is None:
                lang, body = line[3:].strip(), []
            else:
                blocks.append((lang, "\n".join(body)))
                lang = None
            continue
        (body if lang is not None else prose).append(line)
    return "\n".join(prose), blocks


def anchors(path: str) -> Set[str]:
    """GitHub's heading anchors of a Markdown file (lower case, punctuation dropped, spaces to hyphens,
    repeats numbered)."""
    prose, _ = prose_and_blocks(open(path, encoding="utf-8").read())
    seen: Dict[str, int] = {}
    for line in prose.split("\n"):
        m = re.match(r"#{1,6} (.+)", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        yield slug if n == 0 else f"{slug}-{n}"


def relative_links(path: str) -> Iterator[str]:
    prose, _ = prose_and_blocks(open(path, encoding="utf-8").read())
    prose = re.sub(r"`[^`\n]*`", "", prose)  # code spans are not links
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if not re.match(r"[a-z]+:", target):
            yield target


def test_configuration_reference_is_generated_from_the_schema():
    path = os.path.join(ROOT, "docs", "configuration.md")
    text = open(path, encoding="utf-8").read()
    assert reference_page.replace_block(text, path) == text, (
        "docs/configuration.md differs from the schema's field help: run "
        "python -m opendit_lite.config.reference_page --write docs/configuration.md")


def test_reference_lists_every_key_with_its_help():
    block = reference_page.render()
    for key in all_keys(TrainConfig):
        assert f"`{key}`" in block, key
    assert "| `sp_mode` | `ulysses` | `ulysses`, `ring`, `usp`, `dsp`, `auto` |" in block
    assert "| `lr` | `0.0001` | > 0 |" in block and "(also: `learning_rate`)" in block
    assert "| `model.pipeline` | `null` |" in block  # a video key, listed as an addition
    assert "Not taken: `model.num_classes`" in block


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in relative_links(page):
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(page), file)) if file else page
        if not os.path.exists(dest):
            broken.append(f"{target}: no file {rel(dest)}")
        elif anchor and dest.endswith(".md") and anchor not in set(anchors(dest)):
            broken.append(f"{target}: no heading #{anchor} in {rel(dest)}")
    assert not broken, f"{rel(page)}: " + "; ".join(broken)


def test_the_anchor_rule_matches_githubs():
    page = os.path.join(ROOT, "docs", "library_api.md")
    assert "parallelize-one-pipeline-for-every-entry-point" in set(anchors(page))
    assert "the-plugin-with-colossal-ais-booster" in set(anchors(page))


def commands(block: str) -> Iterator[List[str]]:
    """Each simple command of a bash block, as words: continuation lines joined, comments dropped,
    split at ``;``, ``&&``, ``||`` and ``|``, leading shell keywords and VAR=value assignments removed."""
    for line in block.replace("\\\n", " ").split("\n"):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        command: List[str] = []
        for word in words + [";"]:
            if word in (";", "&&", "||", "|") or word.endswith(";"):
                if word.endswith(";") and word != ";":
                    command.append(word[:-1])
                while command and (command[0] in SHELL_WORDS or re.match(r"[A-Z_][A-Z0-9_]*=", command[0])):
                    command.pop(0)
                if command:
                    yield command
                command = []
            else:
                command.append(word)


def script_of(words: List[str]) -> Tuple[str, List[str]]:
    """(repository path of the Python file a command runs, its arguments), or ("", []) when the command
    runs none of ours (pytest, pip, printf, python -c, ...)."""
    for i, word in enumerate(words):
        if word == "-c":
            return "", []
        if word == "-m" and i + 1 < len(words):
            module = words[i + 1]
            if not module.startswith("opendit_lite"):
                return "", []
            path = module.replace(".", "/")
            path = path + "/__main__.py" if os.path.isdir(os.path.join(ROOT, path)) else path + ".py"
            return path, words[i + 2:]
        if word.endswith(".py"):
            return word, words[i + 1:]
    return "", []


def declared_flags(path: str) -> Set[str]:
    """The option strings of every add_argument call in a Python file."""
    flags = set()
    for node in ast.walk(ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return flags | {"--help", "-h"}


def make_targets() -> Set[str]:
    return set(re.findall(r"^([\w-]+):", open(os.path.join(ROOT, "Makefile")).read(), re.M))


def check_command(words: List[str]) -> List[str]:
    """What a documented command names that does not exist."""
    program = words[0]
    if program == "make":
        return [f"make {t}: no such target" for t in words[1:] if "=" not in t and t not in make_targets()]
    if program in ("bash", "sbatch", "sh") or program.endswith(".sh"):
        shell = next((w for w in words if w.endswith(".sh")), None)
        return [] if shell is None or os.path.exists(os.path.join(ROOT, shell)) else [f"{shell}: no such file"]
    if not re.match(r"(python3?|torchrun|\$PY)$", program):
        return []
    path, args = script_of(words)
    if not path:
        return []
    if not os.path.exists(os.path.join(ROOT, path)):
        return [f"{path}: no such file"]
    problems = []
    if path in CONFIG_SCRIPTS:
        keys, flags = CONFIG_SCRIPTS[path], CONFIG_OPTIONS
        for arg in args:
            key = arg.split("=", 1)[0]
            if "=" in arg and not arg.startswith("-") and key not in keys:
                problems.append(f"{path}: no config key {key!r}")
    else:
        flags = declared_flags(path)
    problems += [f"{arg}: no such file" for arg in args
                 if arg.startswith("configs/") and not os.path.exists(os.path.join(ROOT, arg))]
    for arg in args:
        flag = arg.split("=", 1)[0]
        if re.match(r"--?[a-zA-Z]", flag) and flag not in flags:
            problems.append(f"{path}: no option {flag}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_commands_name_scripts_flags_and_keys_that_exist(page):
    _, blocks = prose_and_blocks(open(page, encoding="utf-8").read())
    problems = [f"`{' '.join(words)}`: {p}" for lang, body in blocks if lang in ("bash", "sh")
                for words in commands(body) for p in check_command(words)]
    assert not problems, f"{rel(page)}:\n" + "\n".join(problems)


def yaml_keys(tree: dict, prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        dotted = prefix + str(key)
        yield dotted
        if isinstance(value, dict) and dotted not in ("model.config",):
            yield from yaml_keys(value, dotted + ".")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_yaml_blocks_hold_schema_keys(page):
    _, blocks = prose_and_blocks(open(page, encoding="utf-8").read())
    unknown = []
    for lang, body in blocks:
        tree = yaml.safe_load(body) if lang == "yaml" else None
        if isinstance(tree, dict):
            unknown += [k for k in yaml_keys(tree) if k not in IMAGE_KEYS | VIDEO_KEYS]
    assert not unknown, f"{rel(page)}: config keys the schema does not have: {unknown}"


def test_the_checker_catches_what_it_is_for():
    """A wrong script, option, key and make target are each reported (the checker is not a no-op)."""
    bad = ("python trian.py --config x.yaml\n"
           "python sample.py --config configs/no_such.yaml\n"
           "python train.py --config x.yaml bogus_key=1 --verbose\n"
           "torchrun --nproc_per_node 2 scripts/export_diffusers.py --checkpoint C --nope\n"
           "python -m opendit_lite.plan --config c.yaml --gpu-memory 24 --gpus 8\n"
           "make demo-vidoe\n"
           "FOO=1 python benchmarks/train_step.py --batch-size 2; python scripts/extract_latents.py --csv x\n")
    problems = [p for words in commands(bad) for p in check_command(words)]
    assert problems == ["trian.py: no such file", "configs/no_such.yaml: no such file",
                        "train.py: no config key 'bogus_key'", "train.py: no option --verbose",
                        "scripts/export_diffusers.py: no option --nope",
                        "opendit_lite/plan/__main__.py: no option --gpus",
                        "make demo-vidoe: no such target"], problems
