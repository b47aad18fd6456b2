"""What ``ZImagePipeline`` feeds Z-Image's transformer, for training on the same inputs: the caption
in Qwen3's chat template (a user turn, the assistant's turn opened), encoded by the Qwen3 text
encoder over ``__call__``'s 512 tokens, its second-to-last hidden state cut to the real tokens (a
list, one [L_i, W] per sample); the latents as a list of [C, 1, h, w]; the timestep ``1 - sigma``
(``(1000 - t) / 1000``); the scheduler's shift (fixed in the releases, ``calculate_shift`` over the
2x2 patches when dynamic). The transformer's output is the negated velocity: ``prediction`` negates it
as the pipeline does before its scheduler step.

No guidance embedding: the base model samples with classifier-free guidance (``guidance_scale`` 5, the
empty negative prompt, which caption dropout trains on), Z-Image-Turbo without (``guidance_scale=0``:
the pipeline runs the unconditional branch only for a scale above 0). Both release folders hold the
same classes and configs (the Turbo weights are distilled from guidance, the files do not say so), so
which one a folder holds is declared: ``model.guidance_distilled`` (true for a Turbo folder, false for
the base model), and where it is not set, by default, the folder's name, the repository's
(``Z-Image-Turbo``, as ``huggingface-cli download`` writes it; ``_`` read as ``-``: ``distilled_releases``),
as the planner recognises a release. A Turbo folder samples at guidance 0, and another
``sample.cfg_scale`` is refused (``guidance_free``).

The per-sample caption states are stored padded to the 512 tokens with their mask (``cap_feats``,
``cap_mask``), so that batches, the latents route and caption dropout (a row replaced by the encoded
empty prompt) see fixed shapes; ``inputs`` cuts them back to the pipeline's list.
"""

import torch

from ..conditioning_base import ImageConditioning, flow_mu, flow_shift
from .adapter import caption_list, z_image_time


class ZImageConditioning(ImageConditioning):
    text_keys = ("cap_feats", "cap_mask")
    unguided_scale = 0.0                                  # ZImagePipeline guides only when guidance_scale > 0
    cfg_branches = "batched"       # one call on the prompts' and the negative prompts' rows, in lists of 2B
    distilled_releases = ("Z-Image-Turbo",)               # sampled without guidance (model.guidance_distilled)

    def encode_text(self, pipe, prompts):
        states, _ = self.encode_prompt(pipe, prompts, do_classifier_free_guidance=False)   # B x [L_i, W]
        length = self.max_sequence_length(pipe)
        padded = states[0].new_zeros(len(states), length, states[0].shape[-1])             # [B, 512, W]
        mask = torch.zeros(len(states), length, dtype=torch.bool, device=states[0].device)  # [B, 512]
        for i, s in enumerate(states):
            padded[i, :len(s)], mask[i, :len(s)] = s, True
        return {"cap_feats": padded, "cap_mask": mask}

    def shift(self, pipe, x_shape, model_config):
        B, C, T, H, W = x_shape
        return flow_shift(pipe.scheduler.config, (H // 2) * (W // 2))          # the pipeline's image_seq_len

    def set_timesteps_kwargs(self, pipe, steps, x_shape, model_config):
        from diffusers.pipelines.z_image.pipeline_z_image import get_default_z_image_sigmas

        c = pipe.scheduler.config  # as ZImagePipeline.__call__: its own sigmas, mu from the 2x2 patch count
        B, C, T, H, W = x_shape
        return {"sigmas": get_default_z_image_sigmas(steps), "mu": flow_mu(c, (H // 2) * (W // 2))}

    def inputs(self, model_config, constants, x, t, text):
        return dict(x=list(x.unbind(0)),                                        # B x [C, 1, h, w]
                    t=z_image_time(t.float()),                                  # 1 - sigma
                    cap_feats=caption_list(text["cap_feats"], text["cap_mask"]))  # B x [L_i, W]

    def prediction(self, out, x, model_config, constants):
        return -torch.stack(out)                                                # [B, C, 1, h, w]: the velocity


CONDITIONING = ZImageConditioning()
