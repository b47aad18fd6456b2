"""The configuration schema of train_video.py and sample_video.py.

``VideoTrainConfig`` keeps every top-level key of ``TrainConfig`` (optimizer, ZeRO, SP degree,
checkpointing, EMA, ...) so one set of habits covers both trainers, and swaps the sections that
differ for video: the model (clip geometry, caption width), the data (moving shapes, a CSV of
videos, or precomputed latents), the diffusion objective (rectified flow by default), the sampler
(prompts instead of class labels) and a text-encoder section. Loading, ``--help`` and error
messages come from ``opendit_lite.config.loader`` with ``schema=VideoTrainConfig``.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from .schema import BaseSampleConfig, DiffusionConfig, TrainConfig, _f, _section

TEXT_ENCODER_KINDS = ("shapes", "t5", "clip", "pipeline")
# Settings of the moving-shapes demo, taken when a config leaves them null and trains no pipeline.
DEMO_MODEL, DEMO_CAPTION_TOKENS, DEMO_FRAMES, DEMO_IMAGE_SIZE = "STDiT-tiny", 8, 4, 16
# Guidance against the learned null caption when sample.cfg_scale is null and no pipeline gives its own.
DEFAULT_CFG_SCALE = 4.0


@dataclass
class VideoModelConfig:
    name: Optional[str] = _f(None, "registered video model, e.g. STDiT-XL/2, Vchitect-XL, STDiT-tiny, or a "
                                   "diffusers class of the families trained today (WanTransformer3DModel, "
                                   "FluxTransformer2DModel, SD3Transformer2DModel, CogVideoXTransformer3DModel, "
                                   "HunyuanVideoTransformer3DModel, LTXVideoTransformer3DModel); null: "
                                   "model.pipeline's transformer, else STDiT-tiny")
    pipeline: Optional[str] = _f(None, "a local diffusers pipeline folder (model_index.json; a released model as "
                                       "save_pretrained writes it): its transformer is trained, conditioned as the "
                                       "pipeline conditions it, with its VAE, text encoders and scheduler settings")
    pipeline_class: Optional[str] = _f(None, "model.pipeline: the diffusers pipeline class to load the folder as, "
                                             "when it is not the one its model_index.json names: the folder's "
                                             "family's other pipeline (e.g. WanImageToVideoPipeline for the Wan 2.2 "
                                             "TI2V-5B folder, a WanPipeline, to train its image-to-video); null: the "
                                             "folder's own class")
    guidance: Optional[float] = _f(None, "model.pipeline of a guidance-distilled model (Flux dev, HunyuanVideo): the "
                                         "guidance value trained with; null: the pipeline's default guidance_scale",
                                   above=0)
    guidance_distilled: Optional[bool] = _f(None, "model.pipeline of a model distilled from classifier-free guidance "
                                                  "without a guidance input (Z-Image-Turbo): true samples it at the "
                                                  "pipeline's scale without an unconditional branch and refuses "
                                                  "sample.cfg_scale; false: it uses guidance; null: the family's "
                                                  "default for the folder (a folder named like such a release, "
                                                  "Z-Image-Turbo)")
    path: Optional[str] = _f(None, "diffusers class: local folder with its config.json and weights (from_pretrained, "
                                   "nothing downloaded)")
    config: Optional[dict] = _f(None, "diffusers class: constructor arguments of a random initialisation, e.g. "
                                      "{num_layers: 2, num_attention_heads: 4, attention_head_dim: 16}")
    expert: Optional[str] = _f(None, "model.pipeline with two experts (Wan 2.2 A14B: transformer_2 and "
                                     "boundary_ratio): 'both' trains both, each sample going to the expert whose "
                                     "noise range holds its time (transformer at or above boundary_ratio x 1000, "
                                     "transformer_2 below, as WanPipeline runs them); 'high_noise' (transformer) or "
                                     "'low_noise' (transformer_2) trains that one on its own range; null: both",
                               choices=("both", "high_noise", "low_noise", None))
    input_size: Optional[List[int]] = _f(None, "model input frame size [H, W] (latent or pixel); None: from data and "
                                               "VAE", at_least=1)
    num_frames: Optional[int] = _f(None, "model input frames; None: data.num_frames (or the latents')", at_least=1)
    in_channels: Optional[int] = _f(None, "input channels; None: the VAE's latent channels, 3 in pixel space",
                                    at_least=1)
    caption_channels: Optional[int] = _f(None, "width of the caption states; None: from the text encoder or latents",
                                         at_least=1)
    learn_sigma: bool = _f(False, "also predict the variance (IDDPM's learned-sigma loss); rectified flow ignores it")
    class_dropout_prob: float = _f(0.1, "probability of training on the null caption (for classifier-free guidance)",
                                   at_least=0, at_most=1)


@dataclass
class VideoDataConfig:
    # data.type -> what data.path must point at (checked by the loader)
    PATH_REQUIRED = {"csv": "a CSV file with 'path' and 'text' columns (one video and its caption a row)",
                     "folder": "a folder of images or clips, each with a caption file of the same stem (cat.png + "
                               "cat.txt), or a list of {path, repeats, caption_extension, control_path} entries",
                     "latents": "a folder of .pt files written by opendit_lite.data.video_latents.save_video_latents"}
    type: str = _f("shapes", "dataset kind: shapes (generated), csv, folder (media + same-stem caption files, "
                             "opendit_lite/data/media_folders.py) or latents",
                   choices=("shapes", "csv", "folder", "latents"))
    path: Optional[Union[str, List[dict]]] = _f(None, "CSV file of (path, text[, image]) rows, a precomputed-latent "
                                                      "folder, or (folder) a media folder or a list of {path, "
                                                      "repeats, caption_extension, control_path} entries")
    require_captions: bool = _f(False, "folder: stop (exit 2) when a media file has no caption file, instead of "
                                       "warning and training it on the empty caption")
    num_frames: Optional[int] = _f(None, "frames per clip; null: 4 (shapes), 1 for an image model, the latents' "
                                         "(latents)", at_least=1)
    frame_interval: int = _f(3, "csv: take every n-th frame of the video", at_least=1)
    image_size: Optional[int] = _f(None, "frame side in pixels (shapes: generated size, null: 16; csv: short side "
                                         "resize + centre crop; latents: null, the latents')", at_least=1)
    num_samples: int = _f(256, "shapes: number of generated clips", at_least=1)
    buckets: Optional[List[dict]] = _f(None, "clip shapes to train on together (images are frames: 1), each "
                                             "{frames, resolution + aspect_ratio or height + width, batch_size, "
                                             "probability, loss_weight}; see opendit_lite/data/buckets.py. "
                                             "None: one clip shape (num_frames x image_size^2)")


@dataclass
class VideoDiffusionConfig(DiffusionConfig):
    """The image schema's objective section; null fields take the model's recipe: a diffusers
    family's published one (``opendit_lite.families``), else rectified flow with logit-normal times."""

    objective: Optional[str] = _f(None, "training objective: rflow (rectified flow), vpred (v-prediction, "
                                        "CogVideoX's) or iddpm (Gaussian diffusion); null: the model's recipe "
                                        "(rflow for the zoo's models)", choices=("rflow", "vpred", "iddpm", None))
    timestep_sampling: Optional[str] = _f(None, "rflow: distribution the training times are drawn from; null: the "
                                                "model's recipe (logit-normal for the zoo's models)",
                                          choices=("uniform", "logit-normal", None))


@dataclass
class TextEncoderConfig:
    kind: Optional[str] = _f(None, "caption encoder: t5 / clip from a local folder, 'shapes', the embedded per-word "
                                   "vectors of the moving-shapes data (no download), or 'pipeline', model.pipeline's "
                                   "own text encoders; null: pipeline with model.pipeline, else shapes",
                             choices=TEXT_ENCODER_KINDS + (None,))
    path: Optional[str] = _f(None, "local folder with the text model and its tokenizer (t5, clip)")
    max_length: Optional[int] = _f(None, "caption tokens per sample (120 for Open-Sora's T5); null: 8, or with "
                                         "model.pipeline the tokens its pipeline gives the transformer", at_least=1)


@dataclass
class VideoSampleConfig(BaseSampleConfig):
    sampler: Optional[str] = _f(None, "euler for rectified flow; ddpm or ddim for IDDPM; ddim for v-prediction; "
                                      "null: the first that fits the trained objective",
                                choices=("euler", "ddpm", "ddim", None))
    num_sampling_steps: int = _f(30, "sampling steps", at_least=1)
    cfg_scale: Optional[float] = _f(None, "classifier-free guidance scale (1 disables guidance); null: 4 against the "
                                          "null caption, or with model.pipeline its pipeline's default "
                                          "guidance_scale (a guidance-distilled model's: the trained "
                                          "model.guidance where set)", at_least=0)
    prompts: Optional[List[str]] = _f(None, "captions to sample; None: prompt_file, or a few shapes captions")
    prompt_file: Optional[str] = _f(None, "text file with one prompt a line (used when prompts is empty)")
    images: Optional[List[str]] = _f(None, "an image-conditioned run from model.pipeline (image-to-video, edit): "
                                           "the conditioning image file of each prompt, in order (several for one "
                                           "prompt separated by '|', as the CSV's image column)")
    batch_size: int = _f(8, "prompts per forward on each data-parallel rank", at_least=1)
    every: int = _f(0, "train_video.py / train.py: sample the prompts (and sample.images) every N steps from the "
                       "checkpoint just saved (a multiple of ckpt_every; the weights the run exports), into "
                       "<run dir>/samples/step_<N>/ with a contact sheet, and to TensorBoard / W&B; 0: never",
                    at_least=0)
    num_frames: Optional[int] = _f(None, "frames to sample (pixels, as data.buckets); None: the trained clip's",
                                   at_least=1)
    height: Optional[int] = _f(None, "frame height to sample in pixels; None: the trained clip's", at_least=1)
    width: Optional[int] = _f(None, "frame width to sample in pixels; None: the trained clip's", at_least=1)
    fps: int = _f(4, "frames per second of the written videos", at_least=1)
    output_dir: Optional[str] = _f(None, "folder for the videos and contact sheet; None: "
                                         "<run dir>/samples/<checkpoint name>")


@dataclass
class ExportConfig:
    diffusers: Optional[bool] = _f(None, "at the end of training write <run dir>/diffusers/: a LoRA run's "
                                         "pytorch_lora_weights.safetensors (<Family>Pipeline.load_lora_weights "
                                         "reads it), or the trained transformer(s) as a pipeline folder "
                                         "(model.pipeline: DiffusionPipeline.from_pretrained, the untouched "
                                         "components linked, not copied) or as the transformer's own folder "
                                         "(from_pretrained); null: on for a diffusers family (model.name a "
                                         "diffusers class), off for the zoo's models")
    ema: bool = _f(True, "export the EMA weights (where ema.enable keeps them); false: the trained weights")
    lora: Optional[str] = _f(None, "a LoRA run: 'adapter', the adapters alone in the pipeline's LoRA file, no copy "
                                   "of the base weights; 'merged', the adapters merged into a whole copy of the "
                                   "transformer (as a full fine-tune exports); null: adapter",
                             choices=("merged", "adapter", None))
    lora_format: Optional[str] = _f(None, "a LoRA run's adapter file(s): 'diffusers', the pipeline's "
                                          "pytorch_lora_weights.safetensors; 'comfyui', comfyui_lora.safetensors "
                                          "under the original checkpoint's names (diffusion_model.blocks.0.self_attn"
                                          ".q.lora_down.weight; ComfyUI reads it, and load_lora_weights where "
                                          "diffusers converts the family's layout); "
                                          "'both'; null: both for a family with an original layout (all but "
                                          "CogVideoX and HunyuanVideo 1.5), diffusers otherwise",
                                    choices=("diffusers", "comfyui", "both", None))


@dataclass
class VideoTrainConfig(TrainConfig):
    exp_name: str = _f("video", "experiment name: run folder and checkpoint prefix")
    bucket_batch: str = _f("config", "per-bucket batch sizes: 'config' (each bucket's batch_size) or 'auto' "
                                     "(the largest that fits plan_memory_gb, from python -m opendit_lite.plan; a "
                                     "bucket's batch_size then caps it)",
                           choices=("config", "auto"))
    plan_memory_gb: Optional[float] = _f(None, "bucket_batch=auto: memory per device to plan for, in GiB; None: "
                                               "the GPU's total memory", above=0)
    model: VideoModelConfig = _section(VideoModelConfig, "video model to train")
    data: VideoDataConfig = _section(VideoDataConfig, "training clips")
    diffusion: VideoDiffusionConfig = _section(VideoDiffusionConfig, "diffusion objective")
    text_encoder: TextEncoderConfig = _section(TextEncoderConfig, "caption encoder")
    sample: VideoSampleConfig = _section(VideoSampleConfig, "sample_video.py settings")
    export: ExportConfig = _section(ExportConfig, "the diffusers folder written at the end of training")

    def __post_init__(self):
        """The settings left null take the moving-shapes demo's values (and guidance 4), unless the run
        trains a pipeline (``model.pipeline``), which gives them instead (``builders.pipeline.resolve_pipeline``): its
        transformer's class is read here (a cheap JSON read), the rest when the pipeline is checked."""
        m, t, d, s = self.model, self.text_encoder, self.data, self.sample
        if m.pipeline:
            m.name = m.name or _transformer_class(m.pipeline)
            return
        m.name = m.name or DEMO_MODEL
        t.kind = t.kind or "shapes"
        # "is None", not "or": a 0 given is checked against the field's range (an error), not replaced
        t.max_length = DEMO_CAPTION_TOKENS if t.max_length is None else t.max_length
        d.num_frames = DEMO_FRAMES if d.num_frames is None else d.num_frames
        d.image_size = DEMO_IMAGE_SIZE if d.image_size is None else d.image_size
        s.cfg_scale = DEFAULT_CFG_SCALE if s.cfg_scale is None else s.cfg_scale


def _transformer_class(pipeline: str) -> Optional[str]:
    """The class of the pipeline folder's transformer (None when it cannot be read: the pipeline's checks
    say why)."""
    import json
    import os

    try:
        with open(os.path.join(pipeline, "transformer", "config.json")) as f:
            name = json.load(f).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def train_script_schema(tree: Dict[str, Any]):
    """train.py's schema for the settings ``tree`` (the file's and the command line's, merged): a released
    image model's pipeline folder (``model.pipeline``: Flux, SD3) trains as 1-frame clips with the video
    trainer, so its config is a video one; anything else is an image config."""
    model = tree.get("model")
    return VideoTrainConfig if isinstance(model, dict) and model.get("pipeline") else TrainConfig
