"""The image trainer's declarations (``IMAGE_TRAINER``): class-conditional image data, optionally
encoded by a VAE, and a DiT-style model; train.py runs it with the shared loop."""

from ..builders.family import check_model_family
from ..builders.image import (
    build_dataset_from_config,
    build_model_from_config,
    load_vae_from_config,
    resolve_model_geometry,
)
from ..config import ConfigError, TrainConfig
from ..encoders import vae_encode
from .spec import TrainerSpec, TrainingData


def prepare_image_data(cfg: TrainConfig, device, sp_group=None) -> TrainingData:
    if cfg.encoder.fsdp:
        raise ConfigError("'encoder.fsdp' shards frozen text encoders (train_video.py's caption encoder, LiteGen's "
                          "frozen modules); class-conditional train.py has none: remove encoder.fsdp.")
    dataset = build_dataset_from_config(cfg)
    vae = load_vae_from_config(cfg, device)
    resolve_model_geometry(cfg, dataset, vae)
    encode = vae is not None and cfg.data.type != "latents"

    def model_inputs(batch):
        x, y = (t.to(device, non_blocking=True) for t in batch)  # x [B, C, H, W], y [B]
        if encode:
            x = vae_encode(vae, x, cfg.vae.scale_factor)          # [B, C_latent, H/8, W/8]
        return x, dict(y=y)

    return TrainingData(dataset, model_inputs)


def build_image_model(cfg: TrainConfig):
    """The registered image model ``model.name`` (a video model is refused, naming train_video.py)."""
    check_model_family(cfg.model.name, "image")
    return build_model_from_config(cfg)


def describe_image_input(cfg: TrainConfig) -> str:
    m = cfg.model
    return f"input {m.input_size} x {m.in_channels} ch, {m.num_classes} classes"


def periodic_image_evaluation(cfg: TrainConfig, log):
    from ..evaluate.periodic import periodic_evaluation  # the metrics stack only when asked for

    return periodic_evaluation(cfg, log)


IMAGE_TRAINER = TrainerSpec(name="image", schema=TrainConfig, prepare_data=prepare_image_data,
                            build_model=build_image_model, describe=describe_image_input,
                            evaluator=periodic_image_evaluation)


def image_script_trainer(cfg) -> TrainerSpec:
    """train.py's trainer for the parsed config ``cfg`` (``config.train_script_schema`` chose its schema):
    the image trainer, or for a config naming the pipeline folder of an image family (``model.pipeline``:
    Flux, SD3) the video trainer, which trains it on images as 1-frame clips, conditioned as its pipeline
    conditions it. A video family's pipeline is refused, naming train_video.py."""
    from ..builders.pipeline import pipeline_folder
    from .video import VIDEO_TRAINER

    pipeline = getattr(cfg.model, "pipeline", None)
    if not pipeline:
        if cfg.distill.teacher:
            from .distill import distill_trainer

            return distill_trainer(IMAGE_TRAINER)
        return IMAGE_TRAINER
    family = pipeline_folder(pipeline).family
    if not family.adapter.image_only:
        raise ConfigError(f"'model.pipeline' {pipeline!r} is a {family.class_name} pipeline, a video model: train it "
                          f"with train_video.py (the same config); train.py trains the image pipelines (Flux, SD3).")
    from .distill_pipeline import video_script_trainer

    return video_script_trainer(cfg, VIDEO_TRAINER)
