"""Checkpoints move between layouts: a checkpoint written under one of (world size 1/2, zero_degree
0/1/2, sp_size 1/2) resumes under others with the same model and EMA weights and the optimizer
state resharded, so the run continues as the one-process run does (fp32, CPU, gloo).

One reference run (1 process, DDP, no SP) saves steps 1 and 2. Three layouts write step 1 (the
reference's own, 2 ranks x ZeRO-2, 2 ranks x ZeRO-1 x SP 2); each is resumed under two other
layouts for step 2, and every step-2 checkpoint (weights, EMA, AdamW moments) and loss must equal
the reference's up to fp32 reduction-order rounding.
"""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import run_distributed
from tests.reliability.test_bad_inputs import ROOT, TINY
from tests.zero_cpu_shim import install as install_zero_cpu_shim

COMMON = [*TINY, "ema.enable=true", "ckpt_every=1"]
WRITERS = {"B": ["zero_degree=2", "sp_size=1"], "C": ["zero_degree=1", "sp_size=2"]}   # on 2 ranks
RESUMES_2 = [("A", ["zero_degree=2", "sp_size=2"]), ("B", ["zero_degree=0", "sp_size=2"]),
             ("C", ["zero_degree=2", "sp_size=1"])]                                    # on 2 ranks
RESUMES_1 = [("B", ["zero_degree=1"]), ("C", ["zero_degree=0"])]                       # on 1 process


def _train(args):
    """train.py's main in this process, leaving the process group to the caller."""
    import importlib.util

    from opendit_lite.training import trainer

    spec = importlib.util.spec_from_file_location("_train_script", os.path.join(ROOT, "train.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    keep = trainer.cleanup_distributed
    trainer.cleanup_distributed = lambda: None  # several runs share this process's group
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return script.main(list(args))
    finally:
        os.chdir(cwd)
        trainer.cleanup_distributed = keep


def step1(root, name):
    return os.path.join(root, name, "checkpoints", f"{name}_step1")


def _two_ranks(rank, world, root):
    install_zero_cpu_shim()
    for name, layout in WRITERS.items():
        _train([*COMMON, f"results_dir={root}", f"exp_name={name}", "max_steps=1", *layout])
    for source, layout in RESUMES_2:
        name = f"{source}_to_{'_'.join(layout)}"
        _train([*COMMON, f"results_dir={root}", f"exp_name={name}", "max_steps=2", *layout,
                f"resume_from={step1(root, source)}"])


def _files(ckpt):
    model = {}
    for name in os.listdir(os.path.join(ckpt, "model")):
        if name.endswith(".safetensors"):
            model.update(load_file(os.path.join(ckpt, "model", name)))
    moments = {}
    for name in os.listdir(os.path.join(ckpt, "optimizer")):
        if name.startswith("pytorch_optim-"):
            for index, state in torch.load(os.path.join(ckpt, "optimizer", name), weights_only=True).items():
                moments[f"{index}.exp_avg"] = state["exp_avg"]
                moments[f"{index}.exp_avg_sq"] = state["exp_avg_sq"]
    return model, load_file(os.path.join(ckpt, "ema.safetensors")), moments


def _loss(run_dir, step):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return next(row["loss"] for row in map(json.loads, f) if row.get("step") == step and "loss" in row)


@pytest.mark.slow
def test_checkpoints_resume_under_other_layouts(tmp_path, monkeypatch):
    root = str(tmp_path)
    _train([*COMMON, f"results_dir={root}", "exp_name=A", "max_steps=2"])  # the reference, and layout A
    with monkeypatch.context() as patch:
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        run_distributed(_two_ranks, 2, args=(root,), timeout=400)
    install_zero_cpu_shim(monkeypatch)
    for source, layout in RESUMES_1:
        _train([*COMMON, f"results_dir={root}", f"exp_name={source}_to_{'_'.join(layout)}", "max_steps=2", *layout,
                f"resume_from={step1(root, source)}"])

    for name, layout in WRITERS.items():  # the layouts were what they say
        meta = json.load(open(os.path.join(step1(root, name), "meta.json")))
        assert (meta["world_size"], f"zero_degree={meta['zero_degree']}", f"sp_size={meta['sp_size']}") == \
            (2, *layout), meta
    ref = _files(os.path.join(root, "A", "checkpoints", "A_step2"))
    ref_loss = _loss(os.path.join(root, "A"), 2)
    before = _files(step1(root, "A"))
    assert len(ref[2]) >= len(ref[0]) and ref[2].keys() == before[2].keys()  # two moments per trained tensor
    assert any(not torch.equal(before[2][k], ref[2][k]) for k in ref[2])  # step 2 moved them: the check can fail
    resumed = [f"{s}_to_{'_'.join(layout)}" for s, layout in RESUMES_2 + RESUMES_1]
    assert len(resumed) == 5
    for name in resumed:
        got = _files(os.path.join(root, name, "checkpoints", f"{name}_step2"))
        for part, want, have in zip(("weights", "EMA", "AdamW moments"), ref, got):
            assert have.keys() == want.keys(), (name, part)
            for key in want:
                torch.testing.assert_close(have[key], want[key], rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"{name}: {part} {key}: {m}")
        assert _loss(os.path.join(root, name), 2) == pytest.approx(ref_loss, rel=1e-5), name
        with open(os.path.join(root, name, "metrics.jsonl")) as f:
            assert [row["step"] for row in map(json.loads, f) if "loss" in row] == [2], name  # resumed at step 1
