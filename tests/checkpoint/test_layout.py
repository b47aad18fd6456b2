"""One resume scan for both kinds of checkpoint (save_checkpoint folders, LiteGen's files)."""

import json
import os

from opendit_lite.checkpoint.layout import (
    companion_path,
    find_resume_checkpoint,
    list_litegen_checkpoints,
    step_of,
)


def _folder(root, name, step):
    os.makedirs(os.path.join(root, name))
    with open(os.path.join(root, name, "meta.json"), "w") as f:
        json.dump({"version": 1, "files": {}, "step": step}, f)


def _files(root, prefix, kinds=("model", "optimizer", "ema")):
    model = os.path.join(root, prefix + ".pth")
    for kind in kinds:
        open(model if kind == "model" else companion_path(model, kind), "w").close()
    return model


def test_newest_of_either_kind_with_the_needed_companions(tmp_path):
    root = str(tmp_path)
    _folder(root, "e_step2", 2)
    _files(root, "e_step3")
    _files(root, "e_step5", kinds=("model", "optimizer"))  # no EMA file
    _files(root, "other_step9")                             # another experiment
    open(os.path.join(root, "e_step7.pth.tmp-0123456789ab"), "w").close()  # an interrupted save
    assert find_resume_checkpoint(root, "e", needs=("optimizer", "ema")) == os.path.join(root, "e_step3.pth")
    assert find_resume_checkpoint(root, "e", needs=("optimizer",)) == os.path.join(root, "e_step5.pth")
    assert [s for s, _ in list_litegen_checkpoints(root, "e")] == [3, 5]
    _folder(root, "e_step5", 5)
    assert find_resume_checkpoint(root, "e") == os.path.join(root, "e_step5")  # equal steps: the folder
    assert find_resume_checkpoint(os.path.join(root, "absent"), "e") is None
    assert step_of(os.path.join(root, "e_step5")) == 5 and step_of("x/e_step12.pth") == 12 and step_of("e.pth") is None
