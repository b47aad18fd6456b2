"""Bad plugin arguments fail fast with a message that says what is allowed and what to do.

The checks depend only on the world size, so they run in this process with torch.distributed's
answers patched (world of 4, rank 0); every error is raised before any process group is made.
"""

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from opendit_lite.plugins import OpenDiTPlugin


@pytest.fixture
def world_of_4(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)


def test_creates_the_process_group_when_none_exists(monkeypatch):
    """A plain `python` process: the plugin starts the one-rank group itself (the snippet of docs/library_api.md
    test runs that for real, in a subprocess)."""
    import opendit_lite.plugins.opendit_plugin as plugin_module

    started = []
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(started))
    monkeypatch.setattr(plugin_module, "init_distributed", lambda: started.append(True))
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(plugin_module, "build_data_seq_mesh", lambda sp_size: None)
    with pytest.raises(AttributeError):  # stops at the (patched-out) mesh, after the group exists
        OpenDiTPlugin()
    assert started == [True]


@pytest.mark.parametrize("zero_degree", [-1, 4, "2", True, 1.5])
def test_zero_degree_out_of_range(world_of_4, zero_degree):
    with pytest.raises(ValueError, match=r"use 0 \(DDP\), 1 \(ZeRO-1\), 2 \(ZeRO-2\) or 3"):
        OpenDiTPlugin(zero_degree=zero_degree)


def test_unknown_precision_and_negative_clip(world_of_4):
    with pytest.raises(ValueError, match="use one of auto, fp32, tf32, bf16, fp16, fp8"):
        OpenDiTPlugin(precision="int8")
    with pytest.raises(ValueError, match="grad_clip=-1.0 must be >= 0"):
        OpenDiTPlugin(grad_clip=-1.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where no CUDA GPU is visible")
def test_fp8_needs_a_capable_gpu(world_of_4):
    with pytest.raises(ValueError, match="precision=fp8 needs a CUDA GPU"):
        OpenDiTPlugin(precision="fp8")


def test_precision_as_a_name_or_a_resolved_value(world_of_4, monkeypatch):
    """docs/library_api.md's ``OpenDiTPlugin(precision="bf16")`` and the trainers' resolved ``Precision`` alike."""
    import opendit_lite.plugins.opendit_plugin as plugin_module
    from opendit_lite.precision import resolve_precision

    mesh = SimpleNamespace(sp_size=1, dp_size=4, sp_rank=0, dp_rank=0, sp_group=None, dp_group=None)
    monkeypatch.setattr(plugin_module, "build_data_seq_mesh", lambda sp_size: mesh)
    plugin = OpenDiTPlugin(precision="bf16")
    assert plugin.precision == resolve_precision("bf16") and plugin.dtype == torch.bfloat16
    value = resolve_precision("tf32", "cpu")
    plugin = OpenDiTPlugin(precision=value)
    assert plugin.precision is value and plugin.dtype is None  # fp32 weights, no autocast
    assert OpenDiTPlugin().precision.name == ("bf16" if torch.cuda.is_available() else "fp32")  # auto
    assert "auto" not in OpenDiTPlugin().supported_precisions()


@pytest.mark.parametrize("sp_size", [3, 0, 8])
def test_sp_size_must_divide_world(world_of_4, sp_size):
    with pytest.raises(ValueError, match=r"divisor of the world size 4 \(allowed: \[1, 2, 4\]\)"):
        OpenDiTPlugin(sp_size=sp_size)


def test_group_zero_node_size_must_divide_world(world_of_4):
    with pytest.raises(ValueError, match="node_size=3 ranks, which must be a positive divisor of the world size 4"):
        OpenDiTPlugin(zero_degree=2, group_zero=True, node_size=3)


def test_group_zero_default_node_size_without_gpus(world_of_4, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="pass node_size=<ranks per node>"):
        OpenDiTPlugin(zero_degree=1, group_zero=True)


def test_group_zero_needs_zero(world_of_4, monkeypatch):
    import opendit_lite.plugins.opendit_plugin as plugin_module

    monkeypatch.setattr(plugin_module, "usable_zero_degrees", lambda: [0, 1, 2, 3])  # a GPU machine
    with pytest.raises(ValueError, match="needs zero_degree 1 or 2 or 3"):
        OpenDiTPlugin(zero_degree=0, group_zero=True)
    monkeypatch.setattr(plugin_module, "usable_zero_degrees", lambda: [0])  # the CPU: suggest nothing that fails
    with pytest.raises(ValueError, match="set group_zero=false on this machine"):
        OpenDiTPlugin(zero_degree=0, group_zero=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where no CUDA GPU is visible")
@pytest.mark.parametrize("zero_degree", [1, 2, 3])
def test_zero_on_cpu_suggests_only_ddp(world_of_4, zero_degree):
    """On the CPU only DDP runs: the message must not suggest another ZeRO degree that fails too."""
    with pytest.raises(ValueError, match="a CUDA GPU and none is visible") as e:
        OpenDiTPlugin(zero_degree=zero_degree, precision="bf16")
    assert str(e.value).endswith("use zero_degree=0 (DDP) on this machine")


def test_gemini_needs_bf16_or_fp16(world_of_4, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="set precision to 'bf16' or 'fp16'"):
        OpenDiTPlugin(zero_degree=3, precision="fp32")
