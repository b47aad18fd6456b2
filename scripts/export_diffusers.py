"""Export a model trained here to diffusers, or import a diffusers DiT for fine-tuning here.

    # a DiTTransformer2DModel folder (EMA weights unless --no-ema):
    python scripts/export_diffusers.py --checkpoint results/exp/checkpoint_step10000 --output out/dit-diffusers
    # a full DiTPipeline folder (transformer/, vae/, scheduler/, model_index.json):
    python scripts/export_diffusers.py --checkpoint CKPT --output out/dit-pipeline --vae /models/sd-vae-ft-ema
    # the reverse: a diffusers DiT (pipeline or transformer folder) -> one .safetensors that
    # train.py's init_from and sample.py read:
    python scripts/export_diffusers.py --from-diffusers /models/DiT-XL-2-256 --output dit.safetensors
    # a diffusers-family run (Wan, Flux, SD3, CogVideoX, HunyuanVideo, LTX-Video): what train_video.py
    # writes to <run dir>/diffusers/ (opendit_lite/interop/family_checkpoint.py): a LoRA run's adapters
    # alone (pipe.load_lora_weights(OUTPUT), and comfyui_lora.safetensors under the original checkpoint's
    # names where the family has them; --lora-format chooses; --lora merged: merged into a whole copy), a run
    # from model.pipeline as a pipeline folder (untouched components linked), else the transformer folder:
    python scripts/export_diffusers.py --checkpoint outputs/wan/checkpoints/wan_step1500 --output out/wan-transformer

Load the export with ``DiTTransformer2DModel.from_pretrained(OUTPUT)`` (or ``subfolder="transformer"``
for a pipeline). diffusers embeds timesteps with a slightly different frequency spacing than Meta's
DiT; a model trained with ``model.timestep_spacing: diffusers`` uses diffusers' spacing and its
export loads exactly. The export measures the difference on the weights it writes: a model with
Meta's spacing (the default) is refused unless ``--allow-inexact`` is given (then a warning names the
measured difference; ``opendit_lite.interop.use_meta_timestep_frequencies(transformer)`` after
loading makes it exact). Files get mode 0644 (the umask's plain-file mode); an existing --output
folder is replaced only when it holds an earlier export. Errors print one paragraph and exit with
code 2.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opendit_lite.utils.exit_codes import exit_at_once_on_stop_signals, script_main  # noqa: E402

if __name__ == "__main__":
    exit_at_once_on_stop_signals()  # a Ctrl-C or SIGTERM during the imports below: exit 130 at once

from opendit_lite.config import ConfigError, resolve_aliases  # noqa: E402
from opendit_lite.config.paths import check_output_path  # noqa: E402
from opendit_lite.interop import LORA_WEIGHT_NAME, check_pretrained_folder  # noqa: E402
from opendit_lite.utils.options import OptionParser  # noqa: E402

# Largest output difference between the model and a plain from_pretrained of its export that counts
# as exact: fp32 rounding of the same function is ~1e-6; Meta's spacing gives ~1e-2 to 1e-1.
EXACT_TOL = 1e-4


def _saved_config(checkpoint: str) -> dict:
    """The run config stored with checkpoint folder ``checkpoint`` (it must have a model section)."""
    if not os.path.isdir(checkpoint):
        raise ConfigError(f"--checkpoint {checkpoint!r} is not a folder: give a checkpoint folder written by train.py "
                          f"or train_video.py (it holds meta.json with the model config, model/ and ema.safetensors).")
    from opendit_lite.checkpoint.layout import saved_config
    from opendit_lite.errors import CheckpointError

    try:
        saved = saved_config(checkpoint)
    except CheckpointError as e:
        raise ConfigError(f"--checkpoint {checkpoint!r} is not a readable checkpoint ({e}); give a complete checkpoint "
                          f"folder written by train.py or train_video.py.") from None
    if "model" not in saved:
        raise ConfigError(f"--checkpoint {checkpoint!r} has no model config in meta.json: give a checkpoint folder "
                          f"written by train.py or train_video.py.")
    return saved


def _is_diffusers_family(saved: dict) -> bool:
    from opendit_lite.families import is_family

    return is_family(saved["model"].get("name"))


def _model_from_checkpoint(checkpoint: str, use_ema: bool, saved: dict):
    from opendit_lite.checkpoint.weights import load_weights
    from opendit_lite.models import build_model

    m = saved["model"]
    size = m["input_size"]
    spacing = {"timestep_spacing": m["timestep_spacing"]} if m.get("timestep_spacing", "meta") != "meta" else {}
    try:
        model = build_model(m["name"], input_size=(size[0], size[-1]), in_channels=m["in_channels"],
                            num_classes=m["num_classes"], learn_sigma=m["learn_sigma"],
                            class_dropout_prob=m["class_dropout_prob"], **spacing)
        load_weights(model, checkpoint, use_ema=use_ema)
    except (KeyError, ValueError, FileNotFoundError, RuntimeError) as e:
        raise ConfigError(f"cannot rebuild the model of --checkpoint {checkpoint!r}: {e}") from None
    if type(model).__name__ != "DiT":
        raise ConfigError(f"only DiT models export to diffusers' DiTTransformer2DModel; this checkpoint holds "
                          f"{m['name']!r}.")
    return model.float().eval(), resolve_aliases(saved.get("diffusion", {}), "diffusion.")  # older key names too


def _scheduler(diffusion: dict):
    from diffusers import DDIMScheduler

    if diffusion.get("objective", "iddpm") != "iddpm":
        raise ConfigError(f"a DiTPipeline samples a DDPM-trained model; this one was trained with "
                          f"diffusion.objective={diffusion['objective']!r}. Export the transformer alone (no --vae).")
    # Our IDDPM schedules, in diffusers' names: linear betas 1e-4..0.02 scaled to 1000 steps, or cosine.
    steps = diffusion.get("diffusion_steps", 1000)
    if diffusion.get("noise_schedule", "linear") == "cosine":
        return DDIMScheduler(num_train_timesteps=steps, beta_schedule="squaredcos_cap_v2", clip_sample=False)
    scale = 1000 / steps
    return DDIMScheduler(num_train_timesteps=steps, beta_schedule="linear", beta_start=scale * 1e-4,
                         beta_end=scale * 0.02, clip_sample=False)


def _check_output(output: str) -> None:
    """--output must be a new path or an earlier export (a folder with a config, a model index or a LoRA file)."""
    if os.path.isfile(output) or (os.path.lexists(output) and not os.path.isdir(output)):
        raise ConfigError(f"--output {output!r} is an existing file; give a folder path for the export (a new one, "
                          f"or an earlier export to replace).")
    if os.path.isdir(output) and os.listdir(output) and not any(
            os.path.isfile(os.path.join(output, name))
            for name in ("config.json", "model_index.json", LORA_WEIGHT_NAME, f"transformer_2/{LORA_WEIGHT_NAME}")):
        raise ConfigError(f"--output {output!r} is a folder that holds other files, not an earlier diffusers export; "
                          f"give a new folder path (an earlier export is replaced).")
    check_output_path(output, "--output", folder=True)  # a file above it, or a folder this user cannot write to


def _check_exact(model, allow_inexact: bool) -> None:
    """Refuse (or with ``allow_inexact`` warn about) an export whose plain from_pretrained differs."""
    from opendit_lite.interop import timestep_frequency_mismatch

    difference = timestep_frequency_mismatch(model)
    if difference <= EXACT_TOL:
        return
    spacing = "Meta's timestep frequency spacing (model.timestep_spacing: meta, the default)"
    if not allow_inexact:
        raise ConfigError(
            f"this DiT uses {spacing}; diffusers' DiTTransformer2DModel spaces the frequencies differently and its "
            f"config cannot say otherwise, so a plain from_pretrained of the export differs from the model by up to "
            f"{difference:.3g} (measured on these weights). Train with model.timestep_spacing=diffusers for an exact "
            f"export, or pass --allow-inexact and call opendit_lite.interop.use_meta_timestep_frequencies(transformer) "
            f"after loading.")
    print(f"warning: this DiT uses {spacing}: a plain from_pretrained of the export differs from the model by up to "
          f"{difference:.3g} (measured on these weights); call opendit_lite.interop.use_meta_timestep_frequencies("
          f"transformer) after loading for the exact model.", file=sys.stderr)


def _publish(output: str, write) -> str:
    """``write(folder)`` into a temporary sibling of ``output``, moved into place when complete."""
    from opendit_lite.checkpoint.files import atomic_path
    from opendit_lite.interop import make_readable

    with atomic_path(output) as tmp:
        write(tmp)
        make_readable(tmp)
    return output


def export_family(checkpoint: str, output: str, saved: dict, use_ema: bool = True, lora: str = "merged",
                  lora_format: str = None) -> str:
    """A diffusers-family run's checkpoint -> a folder its diffusers class loads (``lora_format``: the
    adapter files of ``lora="adapter"``; None: as train_video.py writes them)."""
    from opendit_lite.interop.family_checkpoint import default_lora_format, export_family_checkpoint

    if lora_format and lora != "adapter":
        raise ConfigError(f"--lora-format {lora_format} names the files of a LoRA run's adapters, and this export "
                          f"writes no adapter file (--lora adapter of a LoRA run does): remove --lora-format.")
    lora_format = lora_format or default_lora_format(saved["model"]["name"])
    return export_family_checkpoint(saved["model"], saved.get("lora"), checkpoint, output, use_ema=use_ema,
                                    lora_mode=lora, lora_format=lora_format)


def export(checkpoint: str, output: str, vae: str = None, use_ema: bool = True, allow_inexact: bool = False,
           lora: str = None, lora_format: str = None) -> str:
    _check_output(output)
    saved = _saved_config(checkpoint)
    if _is_diffusers_family(saved):
        if vae or allow_inexact:
            raise ConfigError(f"--vae and --allow-inexact apply to DiT exports; {checkpoint!r} holds a "
                              f"{saved['model']['name']}, which is written as the transformer its own pipeline loads.")
        default = "adapter" if (saved.get("lora") or {}).get("rank") else "merged"
        return export_family(checkpoint, output, saved, use_ema=use_ema, lora=lora or default,
                             lora_format=lora_format)
    if lora or lora_format:
        raise ConfigError("--lora and --lora-format apply to diffusers-family runs (Wan, Flux, ...); a DiT run's "
                          "adapters are always merged into the exported weights.")
    from opendit_lite.interop import to_diffusers_dit

    model, diffusion = _model_from_checkpoint(checkpoint, use_ema, saved)
    _check_exact(model, allow_inexact)
    transformer = to_diffusers_dit(model)
    if vae is None:
        return _publish(output, transformer.save_pretrained)
    from diffusers import AutoencoderKL, DiTPipeline

    scheduler = _scheduler(diffusion)
    check_pretrained_folder(vae, f"--vae {vae!r}")
    try:
        autoencoder = AutoencoderKL.from_pretrained(vae, use_safetensors=True)
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"--vae {vae!r} is not a diffusers AutoencoderKL folder: {e}") from None
    _publish(output, DiTPipeline(transformer=transformer, vae=autoencoder, scheduler=scheduler).save_pretrained)
    classes = model.y_embedder.num_classes
    if classes != 1000:
        print(f"warning: DiTPipeline's classifier-free guidance uses label 1000 as the null class (ImageNet's); this "
              f"model has {classes} classes, so sample it with guidance_scale=1 (no guidance) in that pipeline.",
              file=sys.stderr)
    return output


def import_diffusers(source: str, output: str) -> str:
    if not output.endswith(".safetensors"):
        raise ConfigError(f"--output {output!r} must name a .safetensors file when importing with --from-diffusers.")
    if os.path.isdir(output):
        raise ConfigError(f"--output {output!r} is a folder; give the path of a .safetensors file to write.")
    check_output_path(output, "--output")
    subfolder = "transformer" if os.path.isdir(os.path.join(source, "transformer")) else None
    check_pretrained_folder(os.path.join(source, subfolder or ""), f"--from-diffusers {source!r}"
                            + (" (its transformer/)" if subfolder else ""))
    from diffusers import DiTTransformer2DModel
    from safetensors.torch import save_file

    from opendit_lite.interop import from_diffusers_dit

    try:
        transformer = DiTTransformer2DModel.from_pretrained(source, subfolder=subfolder, use_safetensors=True)
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"--from-diffusers {source!r} is not a diffusers DiT (pipeline or transformer folder): "
                          f"{e}") from None
    model = from_diffusers_dit(transformer)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, output)
    if model.t_embedder.spacing != "meta":
        print(f"note: this diffusers DiT uses diffusers' timestep spacing; fine-tune it with "
              f"model.timestep_spacing={model.t_embedder.spacing} to keep its outputs.", file=sys.stderr)
    return output


@script_main
def main(argv) -> str:
    p = OptionParser(prog="python scripts/export_diffusers.py", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="checkpoint folder written by train.py (exported to diffusers)")
    source.add_argument("--from-diffusers", help="diffusers DiT pipeline or transformer folder (imported here)")
    p.add_argument("--output", required=True, help="output folder (export) or .safetensors file (import)")
    p.add_argument("--vae", help="diffusers AutoencoderKL folder: write a full DiTPipeline")
    p.add_argument("--no-ema", action="store_true", help="export the trained weights instead of the EMA")
    p.add_argument("--allow-inexact", action="store_true",
                   help="export a DiT with Meta's timestep spacing anyway (warns with the measured difference)")
    p.add_argument("--lora", choices=("merged", "adapter"),
                   help="a diffusers-family LoRA run: the adapters alone as the pipeline's LoRA file (default), or "
                        "merged into a whole copy of the transformer")
    p.add_argument("--lora-format", choices=("diffusers", "comfyui", "both"),
                   help="the adapter file(s) of --lora adapter: the pipeline's pytorch_lora_weights.safetensors, "
                        "comfyui_lora.safetensors under the original checkpoint's names, or both (default: both for "
                        "a family with an original layout, as train_video.py writes)")
    args = p.parse_args(argv)
    if args.from_diffusers:
        if args.vae or args.no_ema or args.allow_inexact or args.lora or args.lora_format:
            raise ConfigError("--vae, --no-ema, --allow-inexact, --lora and --lora-format apply to --checkpoint "
                              "exports, not to --from-diffusers imports.")
        out = import_diffusers(args.from_diffusers, args.output)
        print(f"wrote our DiT's weights from {args.from_diffusers} to {out}")
        return out
    out = export(args.checkpoint, args.output, vae=args.vae, use_ema=not args.no_ema, allow_inexact=args.allow_inexact,
                 lora=args.lora, lora_format=args.lora_format)
    print(f"wrote {_written(out)} ({'trained' if args.no_ema else 'EMA'} weights) from {args.checkpoint} to {out}")
    return out


def _written(out: str) -> str:
    """What an export folder holds: a pipeline, a model, or LoRA adapters alone."""
    for name in ("model_index.json", "config.json"):
        if os.path.isfile(os.path.join(out, name)):
            with open(os.path.join(out, name)) as f:
                return f"a diffusers {json.load(f)['_class_name']}"
    return "the LoRA adapters (pipe.load_lora_weights(OUTPUT))"


if __name__ == "__main__":
    main()
