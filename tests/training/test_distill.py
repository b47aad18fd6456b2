"""Few-step distillation (distill.teacher, DMD2) in train.py: each optimizer step trains one network and
leaves the other's gradients None, so one AdamW advances each network's state on its own steps only (as
two optimizers would); the LoRA layout's adapter-free base is the teacher; and the whole path at toy size
(a teacher trained a few steps, distilled with two LoRA adapters, resumed bit-identically, sampled by
sample.py, refusals with exit code 2)."""

import os
from types import SimpleNamespace

import torch
from safetensors.torch import load_file

from opendit_lite.builders.distill_model import CRITIC, STUDENT, TEACHER, DistillModule, add_adapters, load_student
from opendit_lite.diffusion import build_scheduler
from opendit_lite.diffusion.sampling_utils import SampleGenerators
from opendit_lite.models import DiT
from opendit_lite.training.distill import distill_loss, is_student_step
from tests.script_server import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_dit(seed: int = 0) -> DiT:
    """DiT-T/2-like at 8x8 pixels with every weight random (a fresh DiT's zero output layer passes no gradient)."""
    torch.manual_seed(seed)
    model = DiT(input_size=8, patch_size=2, in_channels=3, hidden_size=32, depth=1, num_heads=2, num_classes=4,
                class_dropout_prob=0.1, learn_sigma=False)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    return model


def _cfg():
    return SimpleNamespace(distill=SimpleNamespace(student_timesteps=2, guidance_scale=3.0, critic_updates=1),
                           model=SimpleNamespace(num_classes=4, class_dropout_prob=0.1, name="DiT-T/2"), global_seed=0)


def _step(module, optimizer, step: int) -> None:
    x, y = torch.zeros(2, 3, 8, 8), torch.tensor([0, 3])
    loss = distill_loss(module, build_scheduler("rflow", num_timesteps=1000), _cfg(), x, dict(y=y),
                        SampleGenerators(0, [0, 1], stream=(step,)), step)
    loss.backward()
    critic_step = not is_student_step(step, 1)
    for name, p in module.named_parameters():
        trained = p.requires_grad and name.startswith(CRITIC if critic_step else STUDENT)
        assert (p.grad is not None) == trained, f"step {step}: {name} grad {'missing' if trained else 'set'}"
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_each_step_trains_one_network_and_adam_state_advances_on_its_own_steps():
    module = DistillModule(tiny_dit(), tiny_dit(), tiny_dit())
    trainable = [p for p in module.parameters() if p.requires_grad]
    assert len(trainable) == 2 * sum(p.requires_grad for p in tiny_dit().parameters())  # the teacher is frozen
    optimizer = torch.optim.AdamW(trainable, lr=1e-3, weight_decay=0.01)
    teacher = {k: v.clone() for k, v in module.teacher.state_dict().items()}
    student_before = {k: v.clone() for k, v in module.student.state_dict().items()}
    _step(module, optimizer, 0)  # a critic step: the student has no Adam state yet and is unchanged
    assert all(p not in optimizer.state for p in module.student.parameters())
    assert all(torch.equal(v, student_before[k]) for k, v in module.student.state_dict().items())
    _step(module, optimizer, 1)  # a student step: the critic's state did not advance
    _step(module, optimizer, 2)  # a critic step
    assert {int(optimizer.state[p]["step"]) for p in module.critic.parameters() if p.requires_grad} == {2}
    assert {int(optimizer.state[p]["step"]) for p in module.student.parameters() if p.requires_grad} == {1}
    assert any(not torch.equal(v, student_before[k]) for k, v in module.student.state_dict().items())
    assert all(torch.equal(v, teacher[k]) for k, v in module.teacher.state_dict().items())


def test_lora_layout_base_is_teacher_and_student_loads_merged():
    base, reference = tiny_dit(), tiny_dit()
    add_adapters(base, (STUDENT, CRITIC), rank=2, alpha=2.0, dropout=0.0, targets=None)
    module = DistillModule(base).eval()
    assert all(".lora_" in n for n, p in module.named_parameters() if p.requires_grad)
    x, t, y = torch.randn(2, 3, 8, 8), torch.tensor([500.0, 20.0]), torch.tensor([1, 2])
    with torch.no_grad():
        for name, p in module.named_parameters():
            if f"lora_B.{STUDENT}." in name:
                p.normal_(0.0, 0.1)
        expected = reference.eval()(x, t, y)
        torch.testing.assert_close(module(x, t, role=TEACHER, y=y), expected, rtol=0, atol=0)
        torch.testing.assert_close(module(x, t, role=CRITIC, y=y), expected, rtol=0, atol=0)  # B = 0: a no-op
        student = module(x, t, role=STUDENT, y=y)
        assert (student - expected).abs().max() > 1e-3
        state = {f"base.{k}": v for k, v in module.base.state_dict().items()}
        merged = load_student_from_state(state)
        torch.testing.assert_close(merged.eval()(x, t, y), student, rtol=1e-5, atol=1e-5)


def load_student_from_state(state):
    """``load_student`` of a checkpoint holding ``state`` (the module's), written as a safetensors file."""
    import tempfile

    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "weights.safetensors")
        save_file({k: v.contiguous() for k, v in state.items()}, path)
        return load_student(tiny_dit(seed=1), path, use_ema=False,
                            lora=dict(rank=2, alpha=2.0, dropout=0.0, targets=None))


def _run(script: str, *args: str):
    return run_script([script, *args], cwd=ROOT, timeout=600)


def test_train_distill_resume_sample_and_refusals(tmp_path):
    small = [f"results_dir={tmp_path}", "model.name=DiT-T/2", "global_batch_size=4", "data.num_samples=16",
             "data.image_size=8", "log_every=1", "logger=[]"]
    teacher = _run("train.py", "--config", "configs/demo.yaml", *small, "exp_name=teacher", "max_steps=2",
                   "warmup_steps=0", "ckpt_every=0")
    assert teacher.returncode == 0, teacher.stderr[-3000:]
    distill = ["--config", "configs/demo_distill.yaml", *small, f"distill.teacher={tmp_path}/teacher", "lora.rank=2",
               "distill.student_timesteps=2", "sample.num_sampling_steps=2", "distill.critic_updates=1",
               "distill.gan_weight=0.5"]  # the GAN term on: its head is checkpointed and resumed too
    straight = _run("train.py", *distill, "exp_name=straight", "max_steps=4", "ckpt_every=0")
    assert straight.returncode == 0, straight.stderr[-3000:]
    for max_steps in (2, 4):  # interrupted after 2 steps, resumed to 4
        run = _run("train.py", *distill, "exp_name=resumed", f"max_steps={max_steps}", "auto_resume=true")
        assert run.returncode == 0, run.stderr[-3000:]
    for part in ("model/model-00001.safetensors", "ema.safetensors"):
        a = load_file(f"{tmp_path}/straight/checkpoints/straight_step4/{part}")
        b = load_file(f"{tmp_path}/resumed/checkpoints/resumed_step4/{part}")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part
    assert any(".lora_B.student." in k and a[k].abs().max() > 0 for k in a)  # the student trained
    assert any(k.startswith("gan_head.") for k in a)
    assert os.path.isfile(f"{tmp_path}/straight/student.safetensors")

    grid = _run("sample.py", *distill, "exp_name=resumed", "sample.samples_per_class=1")
    assert grid.returncode == 0, grid.stderr[-3000:]
    assert "sampling the 2-step student" in grid.stdout and os.path.isfile(
        f"{tmp_path}/resumed/samples/resumed_step4.png")
    refusals = {  # what the run is refused for -> words of its one-paragraph message
        ("sample.py", "exp_name=resumed", "sample.num_sampling_steps=30"): "distilled to 2 steps",
        ("sample.py", "exp_name=resumed", "sample.cfg_scale=4"): "sample.cfg_scale=1",
        ("train.py", "exp_name=other", "model.name=DiT-Mini/2"): "another model than this run",
        ("train.py", "exp_name=other", "sample.num_sampling_steps=4"): "distill.student_timesteps=2",
        ("train.py", "exp_name=other", "distill.teacher=/nonexistent"): "does not exist",
        ("train.py", "exp_name=other", "zero_degree=3", "lora.rank=0"): "zero_degree=3 (Gemini)",
        ("train.py", "exp_name=other", "sp_size=2"): "distill.gan_weight=0.5 with sp_size=2",
        ("train.py", "exp_name=other", f"init_from={tmp_path}/teacher"): "start from the teacher's weights",
        ("train.py", "exp_name=resumed", "auto_resume=true", "distill.critic_updates=2"): "other distillation settings",
    }
    for (script, *args), words in refusals.items():
        proc = _run(script, *distill, *args)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.returncode, proc.stderr[-2000:])
