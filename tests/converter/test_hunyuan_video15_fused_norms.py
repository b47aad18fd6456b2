"""HunyuanVideo 1.5's TeaCache signal (``step_cache.py``) is the tensor its first block's attention
receives. (Its fused AdaLN, ``fused_norms.py``, against the unconverted model: with the other families in
tests/converter/test_diffusers_families.py.)"""

import torch

from opendit_lite.families import FAMILIES
from tests.parallel import tiny_families as fam


def test_teacache_signal_is_what_the_first_block_attention_receives():
    model = fam.build("hunyuan_video15").eval()
    block, seen = model.transformer_blocks[0], {}
    spec = FAMILIES["hunyuan_video15"].step_cache
    assert type(block).__name__ == spec.head_block
    block.register_forward_pre_hook(
        lambda m, args, kwargs: seen.update(signal=spec.teacache_signal(m, args, kwargs)), with_kwargs=True)
    block.attn.register_forward_pre_hook(lambda m, args, kwargs: seen.update(attn=kwargs["hidden_states"]),
                                         with_kwargs=True)
    with torch.no_grad():
        model(**fam.inputs("hunyuan_video15", model))
    assert torch.equal(seen["signal"], seen["attn"])
