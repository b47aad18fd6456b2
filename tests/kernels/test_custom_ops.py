"""The norm kernels as torch custom ops: torch's ``opcheck`` (schema, fake tensors, autograd
registration, AOT dispatch) on small inputs, and a DiT block compiled with ``fullgraph=True``
(no graph break around the kernels) that equals the eager block."""

import copy

import pytest
import torch
from torch import library as torch_ops

from opendit_lite.converter import ModuleConverter
from opendit_lite.kernels import custom_ops, triton_runs_on
from opendit_lite.models.dit import DiTBlock
from tests.kernels.helpers import DEVICE

pytestmark = pytest.mark.skipif(not triton_runs_on(torch.zeros(1, device=DEVICE)),
                                reason="the Triton kernels do not run here (no CUDA, no TRITON_INTERPRET=1)")


def _randn(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, device=DEVICE, dtype=dtype).requires_grad_(grad)


@pytest.mark.parametrize("mod_rows", [1, 5])
def test_opcheck_norm_affine(mod_rows):
    torch.manual_seed(0)
    x = _randn(2, 5, 24, grad=True)
    shift, scale = _randn(2, mod_rows, 24, grad=True), _randn(2, mod_rows, 24, grad=True)
    torch_ops.opcheck(custom_ops.norm_affine_fwd, (x, shift, scale, 1e-6, True, torch.float32))
    y, mean, rstd = custom_ops.norm_affine_fwd(x.detach(), shift.detach(), scale.detach(), 1e-6, True, torch.float32)
    torch_ops.opcheck(custom_ops.norm_affine_bwd, (torch.randn_like(y), x.detach(), scale.detach(), mean, rstd, True,
                                                torch.float32))


@pytest.mark.parametrize("scale_plus_one", [True, False])
@pytest.mark.parametrize("mod_rows", [1, 5])
def test_opcheck_gated_residual(mod_rows, scale_plus_one):
    torch.manual_seed(0)
    x, h = _randn(2, 5, 24, grad=True), _randn(2, 5, 24, grad=True)
    gate, shift, scale = (_randn(2, mod_rows, 24, grad=True) for _ in range(3))
    torch_ops.opcheck(custom_ops.gated_residual_norm_fwd, (x, h, gate, shift, scale, 1e-6, scale_plus_one,
                                                      torch.float32))
    x_new, y, mean, rstd = custom_ops.gated_residual_norm_fwd(*(t.detach() for t in (x, h, gate, shift, scale)), 1e-6,
                                                              scale_plus_one, torch.float32)
    for dx_new in (torch.randn_like(x_new), None):
        torch_ops.opcheck(custom_ops.gated_residual_norm_bwd, (torch.randn_like(y), dx_new, x_new, h.detach(),
                                                            gate.detach(), scale.detach(), mean, rstd,
                                                            scale_plus_one, torch.float32, torch.float32))


def test_compiled_block_has_no_graph_break_and_matches_eager():
    torch.manual_seed(0)
    block = DiTBlock(hidden_size=24, num_heads=2).to(DEVICE)
    with torch.no_grad():
        for p in block.parameters():  # DiT zero-initialises adaLN; random weights make the check bite
            p.copy_(torch.randn_like(p) * 0.2)
    ModuleConverter({"fused_adaln": True}).convert(block)
    assert type(block.norm2).__name__ == "FusedGatedResidualNorm"
    compiled = torch.compile(copy.deepcopy(block), fullgraph=True, backend="aot_eager")
    x, c = torch.randn(2, 5, 24, device=DEVICE), torch.randn(2, 24, device=DEVICE)

    def run(model):
        model.zero_grad()
        xi = x.clone().requires_grad_()
        out = model(xi, c)
        out.square().sum().backward()
        return [out.detach(), xi.grad] + [p.grad for p in model.parameters()]

    torch._dynamo.reset()
    for got, expected in zip(run(compiled), run(block)):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
