"""A new user's first hour, in a plain `python` process (no torchrun): docs/library_api.md's Booster snippet
runs as written, and a LiteGen run's checkpoints are read by sample.py.

Each case is a subprocess with torchrun's variables removed, so the process group the plugin or
LiteGen starts for itself does not leak into the test process.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def plain_python(args, cwd):
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{args[0]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def page_block(heading: str) -> str:
    """The first ```python block after ``heading`` in docs/library_api.md."""
    text = open(os.path.join(ROOT, "docs", "library_api.md")).read()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_library_api_booster_snippet_runs_in_plain_python(tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(page_block("\n## The plugin with Colossal-AI's Booster"))
    proc = plain_python([str(script)], cwd=tmp_path)
    assert "step 1: loss" in proc.stdout
    assert "parallelize:" in proc.stdout  # the report, printed


LITEGEN_RUN = textwrap.dedent("""
    import sys, yaml, torch
    from opendit_lite import LiteGen
    from opendit_lite.config import from_object
    from opendit_lite.data.shapes import ShapesDataset
    from opendit_lite.diffusion import RectifiedFlow
    from opendit_lite.builders.image import build_model_from_config

    with open(sys.argv[1]) as f:
        config = yaml.safe_load(f)          # a plain dict, as a LiteGen user's EasyDict
    model = build_model_from_config(from_object(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = LiteGen(config)
    model, optimizer, loader = gen.initialize(model, optimizer, ShapesDataset(num_samples=32, image_size=16))
    objective = RectifiedFlow()
    for step, (x, y) in zip(range(1, 3), loader):
        loss = objective.training_losses(model, x, model_kwargs=dict(y=y))["loss"].mean()
        gen.booster.backward(loss, optimizer)
        optimizer.step(); optimizer.zero_grad()
        gen.update_ema(model)               # ema.decay of the config
    print(gen.save_model(step=2), gen.save_optimizer(step=2), gen.save_ema(step=2))
    print(gen.save_checkpoint(1))
""")


@pytest.mark.slow
def test_litegen_run_in_plain_python_samples_with_sample_py(tmp_path):
    config = {
        "exp_name": "lg", "results_dir": str(tmp_path), "global_batch_size": 8, "learning_rate": 1e-3,
        "model": {"name": "DiT-T/2", "input_size": [16], "in_channels": 3, "num_classes": 8, "learn_sigma": False},
        "data": {"image_size": 16, "num_samples": 32},
        "diffusion": {"scheduler": "rflow"},  # LiteGen/OpenDiT's name of diffusion.objective
        "ema": {"decay": 0.5},
        "sample": {"sampler": "euler", "num_sampling_steps": 2, "samples_per_class": 1, "class_labels": [0, 1]},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    script = tmp_path / "run.py"
    script.write_text(LITEGEN_RUN)
    proc = plain_python([str(script), str(path)], cwd=tmp_path)
    folder = os.path.join(str(tmp_path), "lg", "checkpoints")  # checkpoint_dir's default, as train.py
    assert sorted(os.listdir(folder)) == ["lg_step1", "lg_step2.ema.pth", "lg_step2.optim_state.pth", "lg_step2.pth"]
    assert "parallelize:" in proc.stdout  # the report, printed on rank 0

    # The newest of the run (step 2: LiteGen's files, EMA weights), then the step-1 folder explicitly.
    for extra in ([], [f"sample.ckpt={os.path.join(folder, 'lg_step1')}"]):
        out = tmp_path / f"grid{len(extra)}.png"
        proc = plain_python([os.path.join(ROOT, "sample.py"), "--config", str(path), f"sample.output={out}", *extra],
                            cwd=ROOT)
        assert os.path.isfile(out), proc.stdout
        assert ("lg_step1" if extra else "lg_step2.pth") in proc.stdout
