"""What Qwen-Image's edit pipelines feed the transformer, for training on the same inputs:
``QwenImageEditPipeline`` (one reference image) and ``QwenImageEditPlusPipeline`` (several).

* the reference images: each resized by the pipeline's area rule (``calculate_dimensions``: about
  1024 x 1024 pixels at the image's aspect ratio, sides of 32; ``reference_size``), encoded by its VAE
  through its own ``_encode_vae_image`` (the posterior mode, normalised by the per-channel mean and
  std) and packed in 2x2 patches by its ``_pack_latents``; the transformer gets them on the token
  axis after the target's tokens, and ``img_shapes`` lists the target's patch grid then each
  reference's;
* the caption: in the edit prompt template with the image inside (Qwen2.5-VL sees the reference
  through its vision tower: ``encode_prompt(prompt, image=...)``; the Plus pipeline prefixes
  "Picture n:" per image, its images resized to about 384 x 384 for this), the template's system
  prefix (64 tokens) dropped. The unconditional branch of true CFG encodes the negative prompt with
  the same images, so the null text is per sample (``null_text_per_image``);
* the prediction is cut to the target's tokens (``noise_pred[:, :latents.size(1)]``), so the loss
  covers the target only; the time shift is the scheduler's for the target's tokens.

Images reach ``encode_images`` / ``encode_text`` as [3, H, W] tensors in [-1, 1] already at
``reference_size``; they are turned back into the 8-bit pictures the pipeline takes (exact for
pictures loaded as 8-bit) and go through the pipeline's own image processor and text processor.
The Plus pipeline resizes the picture the caller gives to both sizes; here its vision-language image
is resized from the reference (already at the VAE's size), not from the original picture.

Stored text is padded to the caption bound (512 tokens) plus the sample's vision-prompt tokens; a
caption longer than the bound is refused. References of one batch share a size (their tokens are
stacked), as the data's buckets give them.
"""

import torch

from ...errors import ConfigError
from .conditioning import MASK, STATES, QwenImageConditioning, padded_text

REFERENCE = "reference_latents"          # [B, sum of the references' tokens, 4C]
REFERENCE_GRID = "reference_grid"       # [B, n_images, 2]: each reference's patch rows, columns
CAPTION_TOKENS = 512                    # the caption bound (the pipelines' max_sequence_length default)
RELEASED_PIXELS_PER_TOKEN = 16          # the released Qwen-Image VAE (8x fewer rows), then 2x2 patches
# The released processor's image sizes (Qwen2.5-VL's preprocessor_config.json, which the edit releases carry):
# 14-pixel patches merged 2 x 2 into one token, sides rounded to 28, between 3136 and 12845056 pixels.
RELEASED_VISION = dict(factor=28, min_pixels=3136, max_pixels=12845056)
VISION_MARKERS = 2                      # <|vision_start|> and <|vision_end|> around each image's tokens


def vision_tokens(height: int, width: int) -> int:
    """The text tokens a ``height x width`` picture takes in the released Qwen2.5-VL prompt (the processor's own
    ``smart_resize``, then one token per 28 x 28 pixels), with its markers."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    rows, columns = smart_resize(height, width, **RELEASED_VISION)
    factor = RELEASED_VISION["factor"]
    return (rows // factor) * (columns // factor) + VISION_MARKERS


def to_picture(image: torch.Tensor):
    """[3, H, W] in [-1, 1] -> the 8-bit RGB picture it was loaded from (a PIL image)."""
    from PIL import Image

    pixels = ((image.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)   # [3, H, W]
    return Image.fromarray(pixels.permute(1, 2, 0).numpy())


class QwenImageEditConditioning(QwenImageConditioning):
    """``QwenImageEditPipeline``: one reference image, seen by the VAE and the vision-language prompt at
    the same ~1024 x 1024 size."""

    image_input = "reference"
    max_images = 1
    image_keys = (REFERENCE, REFERENCE_GRID)
    null_text_per_image = True
    module = "diffusers.pipelines.qwenimage.pipeline_qwenimage_edit"
    vae_area = 1024 * 1024               # the area __call__ resizes the reference to

    def _dimensions(self, area: int, height: int, width: int):
        """(height, width) by the pipeline module's own ``calculate_dimensions``."""
        import importlib

        width_, height_ = importlib.import_module(self.module).calculate_dimensions(area, width / height)[:2]
        return int(height_), int(width_)

    def reference_size(self, pipe, height, width):
        return self._dimensions(self.vae_area, height, width)

    def prompt_images(self, pipe, pictures):
        """The pictures ``encode_prompt`` takes for one sample (Edit: the reference itself)."""
        return pictures[0]

    def prompt_size(self, height: int, width: int):
        """The (height, width) of the vision-language prompt's picture of a ``height x width`` reference (Edit: the
        reference at its VAE size)."""
        return self._dimensions(self.vae_area, height, width)

    def planned_tokens(self, height, width):
        """One reference of the target's aspect ratio: its packed tokens at the area rule's size (about 4,100 at
        1024 x 1024), and its vision tokens in the prompt (about 1,370 at that size; Edit-Plus: about 200 at
        384 x 384), which ``text_tokens`` leaves out."""
        rows, columns = self.reference_size(None, height, width)
        tokens = (rows // RELEASED_PIXELS_PER_TOKEN) * (columns // RELEASED_PIXELS_PER_TOKEN)
        return tokens, vision_tokens(*self.prompt_size(rows, columns))

    def text_tokens(self, pipe):
        return CAPTION_TOKENS

    def encode_text(self, pipe, prompts, images=None):
        return self._encode(pipe, prompts, images, with_null=False)[0]

    def encode_text_and_null(self, pipe, prompts, images):
        """The captions and the null prompt, each sample's images prepared once and its empty prompt encoded
        once: that encoding gives the stored length's bound and, the null prompt being empty, the null text
        (``encode_text`` of each, the same tensors, with two of its four vision-language runs a sample)."""
        return self._encode(pipe, prompts, images, with_null=True)

    def _encode(self, pipe, prompts, images, with_null: bool):
        if images is None or len(images) != len(prompts):
            raise ConfigError(f"{type(pipe).__name__} encodes each caption with its reference image: give one image "
                              f"list per caption (a data row's image column).")
        texts, nulls = [], []
        for prompt, sample in zip(prompts, images):
            prompt_images = self.prompt_images(pipe, [to_picture(image) for image in sample])
            empty = pipe.encode_prompt([""], image=prompt_images, device=pipe._execution_device)
            bound = CAPTION_TOKENS + empty[0].shape[1]      # the caption bound + the template's vision tokens
            texts.append(self._padded(pipe, prompt, prompt_images, empty, bound))
            if with_null:
                nulls.append(self._padded(pipe, self.null_prompt, prompt_images, empty, bound))
        return tuple({key: torch.cat([s[key] for s in out]) for key in (STATES, MASK)}
                     for out in ((texts, nulls) if with_null else (texts,)))

    def _padded(self, pipe, prompt, prompt_images, empty, bound: int) -> dict:
        """One caption encoded with its images (``empty``: the empty prompt's encoding, reused for it), padded
        to ``bound`` tokens."""
        embeds, mask = empty if prompt == "" else pipe.encode_prompt([prompt], image=prompt_images,
                                                                     device=pipe._execution_device)
        if embeds.shape[1] > bound:
            raise ConfigError(f"a caption of {type(pipe).__name__} takes {embeds.shape[1] - bound + CAPTION_TOKENS} "
                              f"tokens, more than the {CAPTION_TOKENS} the training stores: shorten it.")
        return padded_text(embeds, mask, bound)

    def vae_images(self, pipe, pictures):
        """One sample's pictures -> what the pipeline's VAE encodes, [1, 3, 1, H, W] each."""
        return [pipe.image_processor.preprocess(p, p.height, p.width).unsqueeze(2) for p in pictures]

    def encode_images(self, pipe, images, clip_shape):
        count = {len(sample) for sample in images}
        if not count <= set(range(1, self.max_images + 1)) or len(count) != 1:
            raise ConfigError(f"{type(pipe).__name__} takes 1 to {self.max_images} reference images per sample, the "
                              f"same number in a batch; got {sorted(len(s) for s in images)}.")
        device, dtype = pipe._execution_device, pipe.vae.dtype
        latents, grids = [], []
        for sample in images:
            packed, grid = [], []
            for image in self.vae_images(pipe, [to_picture(image) for image in sample]):
                z = pipe._encode_vae_image(image.to(device=device, dtype=dtype), generator=None)  # [1, C, 1, h, w]
                C, h, w = z.shape[1], z.shape[3], z.shape[4]
                packed.append(pipe._pack_latents(z, 1, C, h, w))                                # [1, hw/4, 4C]
                grid.append((h // 2, w // 2))
            latents.append(torch.cat(packed, dim=1))
            grids.append(torch.tensor(grid))
        if len({tuple(t.shape) for t in latents}) != 1:
            raise ConfigError(f"the reference images of one batch of {type(pipe).__name__} differ in size "
                              f"({[tuple(g.tolist()) for g in grids]} patches); batch references of one size.")
        return {REFERENCE: torch.cat(latents), REFERENCE_GRID: torch.stack(grids).to(device)}

    def inputs(self, model_config, constants, x, t, text):
        inputs = super().inputs(model_config, constants, x, t, text)
        reference = text[REFERENCE].to(inputs["hidden_states"].dtype)                      # [B, Nr, 4C]
        grids = text[REFERENCE_GRID][0].tolist()                                             # one batch, one size
        B, _, _, H, W = x.shape
        inputs["hidden_states"] = torch.cat([inputs["hidden_states"], reference], dim=1)    # [B, N + Nr, 4C]
        inputs["img_shapes"] = [[(1, H // 2, W // 2), *[(1, h, w) for h, w in grids]]] * B
        return inputs

    def prediction(self, out, x, model_config, constants):
        H, W = x.shape[-2:]
        return super().prediction(out[:, :(H // 2) * (W // 2)], x, model_config, constants)   # the target only


class QwenImageEditPlusConditioning(QwenImageEditConditioning):
    """``QwenImageEditPlusPipeline`` (Qwen-Image-Edit-2509): up to three reference images, each resized to
    ~1024 x 1024 for the VAE and to ~384 x 384 for the vision-language prompt ("Picture n:")."""

    max_images = 3                       # the release's model card: best with 1 to 3 images
    module = "diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus"

    def _areas(self):
        import importlib

        module = importlib.import_module(self.module)
        return module.VAE_IMAGE_SIZE, module.CONDITION_IMAGE_SIZE

    def reference_size(self, pipe, height, width):
        return self._dimensions(self._areas()[0], height, width)

    def prompt_size(self, height, width):
        return self._dimensions(self._areas()[1], height, width)

    def prompt_images(self, pipe, pictures):
        return [pipe.image_processor.resize(picture, *self.prompt_size(picture.height, picture.width))
                for picture in pictures]


EDIT = QwenImageEditConditioning()
EDIT_PLUS = QwenImageEditPlusConditioning()
