"""LiteGen's ``update_ema`` warms the decay up for a LoRA config (``ema.warmup`` null: on when
lora.rank > 0), as the trainers do: the EMA of the adapters after three steps equals the EMA computed
here with diffusers' EMAModel decays (0, 2/11, 3/12), in a plain ``python`` process."""

import textwrap

from tests.plugins.test_single_process import plain_python

SCRIPT = textwrap.dedent('''
    import torch, torch.nn as nn
    from diffusers.training_utils import EMAModel
    from opendit_lite.litegen import LiteGen

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.out = nn.Linear(6, 3)

        def forward(self, x):
            return self.out(torch.tanh(self.fc(x)))

    gen = LiteGen(dict(exp_name="w", results_dir=".", precision="fp32", zero_degree=0, global_batch_size=4,
                       lora=dict(rank=2, targets=["fc"]), ema=dict(decay=0.9999)))
    torch.manual_seed(0)
    net = Net()
    model, optimizer = gen.initialize(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
    adapters = lambda: {k: v.detach().clone() for k, v in model.unwrap().state_dict().items() if ".lora_" in k}
    ema, reference = adapters(), EMAModel([torch.nn.Parameter(torch.zeros(1))], decay=0.9999)
    for step in range(3):
        x = torch.randn(4, 6)
        gen.booster.backward(model(x).square().mean(), optimizer)
        optimizer.step()
        optimizer.zero_grad()
        gen.update_ema(model)
        decay = reference.get_decay(step + 1)
        ema = {k: decay * ema[k] + (1 - decay) * v for k, v in adapters().items()}
    got = gen.plugin.ema.state_dict()
    worst = max((got[k] - v).abs().max().item() for k, v in ema.items())
    moved = max((v - adapters()[k]).abs().max().item() for k, v in ema.items())
    assert worst < 1e-6 and moved > 1e-6, (worst, moved)
    print("ema ok", worst)
''')


def test_litegen_warms_the_ema_up_for_lora(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    assert "ema ok" in plain_python([str(script)], cwd=tmp_path).stdout
