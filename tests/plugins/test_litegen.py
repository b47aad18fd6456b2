"""The LiteGen facade: the five-argument initialize on tiny models (2 gloo ranks, ZeRO-2), LiteGen's
file names, and the load priority init_from < resume_from < auto_resume; in one plain process
(no torchrun), docs/library_api.md's snippet and a LiteGen run whose checkpoints sample.py reads.

One spawn runs the whole facade story (process start-up dominates the cost); the naming, config
and classification rules are checked in-process.
"""

import copy
import os
import shutil
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from opendit_lite.checkpoint.layout import checkpoint_root
from opendit_lite.config import ConfigError, from_object
from opendit_lite.litegen import CompiledFunction, classify_components, companion_path, litegen_path
from tests.checkpoint.test_state import run_on_cpu
from tests.zero_cpu_shim import install as install_zero_cpu_shim

EXP = "exp"


# --------------------------------------------------------------------------------------------------
# Naming, config access, component classification, compile fallback (no processes)
# --------------------------------------------------------------------------------------------------

def test_litegen_file_names():
    assert litegen_path("model", "r", "e") == os.path.join("r", "e.pth")
    assert litegen_path("optimizer", "r", "e") == os.path.join("r", "e.optim_state.pth")
    assert litegen_path("ema", "r", "e") == os.path.join("r", "e.ema.pth")
    assert litegen_path("model", "r", "e", step=120) == os.path.join("r", "e_step120.pth")
    assert litegen_path("optimizer", "r", "e", step=5) == os.path.join("r", "e_step5.optim_state.pth")
    assert litegen_path("ema", "r", "e", step=5) == os.path.join("r", "e_step5.ema.pth")
    assert litegen_path("ema", "r", "e", filename="mine.pt", step=5) == os.path.join("r", "mine.pt")
    assert companion_path("a/e_step5.pth", "optimizer") == "a/e_step5.optim_state.pth"
    assert companion_path("a/model_10.pth", "ema") == "a/model_10.ema.pth"


def test_config_objects_and_checkpoint_folder():
    """LiteGen reads its config with config.from_object; checkpoint_dir means what it means for train.py."""
    assert checkpoint_root(from_object(SimpleNamespace(results_dir="a", checkpoint_dir="c"))) == "c"
    litegen_config = from_object(SimpleNamespace(result_dir="b", exp_name="e"))
    assert checkpoint_root(litegen_config) == os.path.join("b", "e", "checkpoints")
    assert checkpoint_root(from_object(SimpleNamespace())) == os.path.join("outputs", "dit", "checkpoints")  # defaults
    cfg = from_object(SimpleNamespace(zero_degree=2, ema={"enable": False}, encoder=SimpleNamespace(fsdp=True)))
    assert cfg.zero_degree == 2
    assert cfg.ema.enable is False  # dict section inside an attribute config
    assert cfg.encoder.fsdp is True
    assert cfg.encoder.group is False  # missing: TrainConfig's default
    assert cfg.global_batch_size == 32
    assert from_object({"sp_size": 1}).sp_size == 1
    with pytest.raises(ConfigError, match="Unknown config key 'selective_ration'. Did you mean 'selective_ratio'?"):
        from_object({"selective_ration": 0.5})


def test_classify_components():
    trainable, frozen = nn.Linear(2, 2), nn.Linear(2, 2).requires_grad_(False)
    opt = torch.optim.SGD(trainable.parameters(), lr=0.1)
    data = TensorDataset(torch.zeros(4, 2))
    assert classify_components([trainable, opt, frozen, data, frozen.forward]) == [
        "trainable", "optimizer", "frozen", "dataset", "function"]
    with pytest.raises(ValueError, match="exactly one trainable module.*none is"):
        classify_components([frozen, data])
    with pytest.raises(ValueError, match=r"exactly one trainable module.*arguments \[0, 1\] are"):
        classify_components([trainable, nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="at most one optimizer"):
        classify_components([trainable, opt, opt])
    with pytest.raises(TypeError, match="argument 1 is a int"):
        classify_components([trainable, 3])


def _affine(x):
    return 2 * x + 1


def test_compiled_function_real_and_fallbacks(monkeypatch):
    x = torch.arange(4.0)
    real_compile = torch.compile
    # Real dynamo tracing, with the eager backend so that no C++ compiler runs.
    monkeypatch.setattr(torch, "compile", partial(real_compile, backend="eager"))
    fn = CompiledFunction(_affine)
    assert torch.equal(fn(x), _affine(x)) and fn.checked and fn.compiled is not None

    def unavailable(f):
        raise RuntimeError("Dynamo is not supported on this Python")

    monkeypatch.setattr(torch, "compile", unavailable)
    fn = CompiledFunction(_affine)
    assert fn.compiled is None and torch.equal(fn(x), _affine(x))

    def broken_on_call(*args):
        raise RuntimeError("inductor failed")

    monkeypatch.setattr(torch, "compile", lambda f: broken_on_call)
    fn = CompiledFunction(_affine)
    assert torch.equal(fn(x), _affine(x)) and fn.compiled is None  # fell back, for good
    assert torch.equal(fn(x + 1), _affine(x + 1))


# --------------------------------------------------------------------------------------------------
# The facade on 2 ranks
# --------------------------------------------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # a checkpointed block runs twice per training step
        return x + torch.tanh(self.fc(x))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


class _VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def encode(self, x):
        return 0.5 * self.proj(x)


def _config(root, **overrides):
    cfg = SimpleNamespace(  # checkpoint_dir=results_dir: LiteGen's flat layout
        exp_name=EXP, results_dir=root, checkpoint_dir=root, precision="fp32", zero_degree=2, sp_size=1, global_seed=0,
        global_batch_size=8, selective_ratio=0.5, ema=SimpleNamespace(enable=True),
        encoder=SimpleNamespace(fsdp=True, group=False), init_from=None, resume_from=None, auto_resume=False,
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def _model_and_optimizer(seed):
    torch.manual_seed(seed)
    model = _Net()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _snapshot(gen, model, optimizer):
    """Weights, full optimizer state, full EMA (a collective)."""
    state = optimizer.state_dict()["state"]
    return {
        "params": {k: v.clone() for k, v in model.unwrap().state_dict().items()},
        "exp_avg": [state[i]["exp_avg"].clone() for i in sorted(state)],
        "ema": gen.plugin.ema.state_dict(),
    }


def _same(a, b, keys=("params", "exp_avg", "ema")):
    for key in keys:
        x, y = a[key], b[key]
        pairs = zip(x.values(), y.values()) if isinstance(x, dict) else zip(x, y, strict=True)
        if isinstance(x, dict):
            assert x.keys() == y.keys()
        for u, v in pairs:
            torch.testing.assert_close(u, v, atol=1e-6, rtol=1e-6, msg=key)


def _train_steps(gen, model, optimizer, loader, n):
    batches = iter(loader)
    for _ in range(n):
        x, y, _ = next(batches)
        gen.booster.backward(F.mse_loss(model(x), y), optimizer)
        optimizer.step()
        optimizer.zero_grad()
        gen.update_ema(model, decay=0.9)


def _resumed(cfg, seed=321):
    """A fresh LiteGen on ``cfg`` with a freshly initialised model: what initialize loaded."""
    from opendit_lite.litegen import LiteGen

    gen = LiteGen(cfg)
    model, optimizer = gen.initialize(*_model_and_optimizer(seed))
    return gen, _snapshot(gen, model, optimizer)


def _facade_story(rank, world, root):
    from colossalai.interface import ModelWrapper, OptimizerWrapper
    from torch.distributed.fsdp import FullyShardedDataParallel

    from opendit_lite.litegen import CompiledFunction, LiteGen

    install_zero_cpu_shim()
    torch.compile = partial(torch.compile, backend="eager")  # real tracing, no C++ toolchain
    other = os.path.join(root, "other")

    # ---- the five-argument call
    gen = LiteGen(_config(root))
    model, optimizer = _model_and_optimizer(seed=0)
    torch.manual_seed(1)
    text_encoder = nn.Sequential(nn.Linear(6, 32), nn.GELU(), nn.Linear(32, 4)).requires_grad_(False)
    vae = _VAE().requires_grad_(False)
    reference_encoder, reference_vae = copy.deepcopy(text_encoder), copy.deepcopy(vae)
    g = torch.Generator().manual_seed(2)
    dataset = TensorDataset(torch.randn(32, 6, generator=g), torch.randn(32, 3, generator=g), torch.arange(32))
    model, optimizer, text_encoder, loader, vae_encode = gen.initialize(model, optimizer, text_encoder, dataset,
                                                                        vae.encode)

    assert isinstance(model, ModelWrapper) and isinstance(optimizer, OptimizerWrapper)
    # parallelize_from_config, as the trainers: selective_ratio 0.5 checkpoints one of the two blocks
    assert gen.parallelize_report.count("activation_checkpointing") == 1
    assert gen.plugin.precision.name == "fp32"  # resolved once, held by the plugin
    assert isinstance(text_encoder, FullyShardedDataParallel) and isinstance(vae_encode, CompiledFunction)
    assert loader.batch_size == 8 // world
    x = torch.randn(5, 6)
    with torch.no_grad():
        torch.testing.assert_close(text_encoder(x), reference_encoder(x))
        torch.testing.assert_close(vae_encode(x), reference_vae.encode(x))
    full_numel = sum(p.numel() for p in reference_encoder.parameters())
    assert sum(p.numel() for p in text_encoder.parameters()) == full_numel // world  # sharded
    indices = [None] * world
    dist.all_gather_object(indices, next(iter(loader))[2].tolist())
    assert not set(indices[0]) & set(indices[1])  # data-parallel ranks get different samples

    # ---- training; selective_ratio 0.5 checkpoints one of the two blocks
    _train_steps(gen, model, optimizer, loader, 2)
    assert sorted(b.calls for b in model.unwrap().blocks) == [2, 4]
    step2 = _snapshot(gen, model, optimizer)

    # ---- LiteGen file names
    names = {
        "model": gen.save_model(step=2), "optimizer": gen.save_optimizer(step=2), "ema": gen.save_ema(step=2),
        "plain": gen.save_model(), "named": gen.save_model(filename="named.pth"),
        "elsewhere": gen.save_ema(output_folder=other),
    }
    assert names == {
        "model": f"{root}/{EXP}_step2.pth", "optimizer": f"{root}/{EXP}_step2.optim_state.pth",
        "ema": f"{root}/{EXP}_step2.ema.pth", "plain": f"{root}/{EXP}.pth", "named": f"{root}/named.pth",
        "elsewhere": f"{other}/{EXP}.ema.pth",
    }
    assert gen.save_optimizer(step=2) == names["optimizer"] and gen.save_model() == names["plain"]  # overwrite
    assert not [n for n in os.listdir(root) if ".tmp-" in n or ".old-" in n]
    assert os.path.isfile(names["model"]) and os.path.isfile(names["ema"])
    assert os.path.isdir(names["optimizer"])  # ZeRO: a folder of shards
    saved_ema = torch.load(names["ema"], weights_only=True)
    _same({"ema": saved_ema}, step2, keys=("ema",))
    _same({"params": torch.load(names["model"], weights_only=True)}, step2, keys=("params",))

    _train_steps(gen, model, optimizer, loader, 1)
    step3 = _snapshot(gen, model, optimizer)
    ckpt3 = gen.save_checkpoint(3, extra_state={"epoch": 1})
    assert ckpt3 == f"{root}/{EXP}_step3"

    # Decoys auto_resume must skip: a save_model killed before its rename, a folder without its
    # completion marker, a newer model file without its optimizer file.
    trip = os.path.join(root, "trip")
    if rank == 0:
        open(f"{root}/{EXP}_step9.pth.tmp-0123456789ab", "w").close()
        os.makedirs(f"{root}/{EXP}_step8")
        shutil.copy(names["model"], f"{root}/{EXP}_step7.pth")
        os.makedirs(trip)
        for path in (names["model"], names["ema"]):
            shutil.copy(path, trip)
        shutil.copytree(names["optimizer"], os.path.join(trip, os.path.basename(names["optimizer"])))
        shutil.copy(names["model"], f"{trip}/{EXP}_step5.pth")
        os.makedirs(os.path.join(root, "empty"))
    dist.barrier()

    # ---- load priority
    fresh_ema = {"ema": step2["params"]}  # an EMA created from the loaded weights

    gen, got = _resumed(_config(root, init_from=names["model"]))  # weights only
    _same(got, step2, keys=("params",))
    _same(got, fresh_ema, keys=("ema",))
    assert got["exp_avg"] == [] and gen.resume_state == {}

    cfg = _config(root, init_from=names["plain"], resume_from=names["model"],
                  ema=SimpleNamespace(enable=True, resume_from=names["ema"]))
    gen, got = _resumed(cfg)  # resume_from beats init_from; EMA from ema.resume_from
    _same(got, step2)
    assert gen.resume_state == {"step": 2}

    gen, got = _resumed(_config(root, init_from=names["model"], auto_resume=True))  # newest complete: step 3
    _same(got, step3)
    assert gen.resume_state["step"] == 3 and gen.resume_state["epoch"] == 1
    assert gen.resume_state["config"]["exp_name"] == EXP

    gen, got = _resumed(_config(root, auto_resume=True, resume_from=names["model"]))  # auto only when empty
    _same(got, step2, keys=("params", "exp_avg"))
    _same(got, fresh_ema, keys=("ema",))  # resume_from alone does not bring the EMA back

    gen, got = _resumed(_config(trip, auto_resume=True))  # LiteGen files: model, optimizer and EMA
    _same(got, step2)
    assert gen.resume_state == {"step": 2}

    gen, got = _resumed(_config(os.path.join(root, "empty"), auto_resume=True, init_from=names["model"]))
    _same(got, step2, keys=("params",))  # nothing to resume: init_from applies
    assert gen.resume_state == {}

    # ---- encoder.group: FSDP inside a node only (here a "node" is one rank: nothing is sharded)
    os.environ["LOCAL_WORLD_SIZE"] = "1"
    gen = LiteGen(_config(root, encoder=SimpleNamespace(fsdp=True, group=True), ema=SimpleNamespace(enable=False)))
    _, grouped = gen.initialize(_model_and_optimizer(0)[0], copy.deepcopy(reference_encoder))
    assert sum(p.numel() for p in grouped.parameters()) == full_numel
    with torch.no_grad():
        torch.testing.assert_close(grouped(x), reference_encoder(x))


def test_litegen_facade_two_ranks(tmp_path):
    run_on_cpu(_facade_story, 2, (str(tmp_path),))
