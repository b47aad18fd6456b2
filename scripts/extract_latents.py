"""Encode a dataset once and train from the result.

Images for our DiT (``data.type=latents data.path=<output>`` in train.py):

    python scripts/extract_latents.py --data-path /data/imagenet/train --vae-path /models/sd-vae-ft-ema \\
        --image-size 256 --output /data/imagenet256_latents

Each image is centre-cropped like DiT, encoded (the posterior is sampled once; pass --mode to store
its mean) and scaled by --scale-factor; shards are written as they fill.

Clips or images for a run from a diffusers pipeline folder (``model.pipeline``: Wan, CogVideoX,
HunyuanVideo, LTX-Video, Flux, SD3), encoded once by the pipeline's own VAE and text encoders into
exactly what the run's CSV route trains on (the VAE's posterior mean, normalised as the pipeline
decodes it, and every text input its ``encode_prompt`` gives the transformer, with what it feeds its
unconditional branch), on as many ranks as you launch (each encodes every N-th row of the CSV; rank 0
writes meta.json, with the pipeline's fingerprint and each clip's size, when all are done);
train_video.py reads the folder with ``data.type=latents data.path=<output>``:

    torchrun --nproc_per_node 8 scripts/extract_latents.py --pipeline /models/Wan2.1-T2V-1.3B-Diffusers \\
        --csv /data/clips.csv --num-frames 17 --height 480 --width 832 --output /data/wan_latents
    python scripts/extract_latents.py --config configs/wan_lora.yaml --output /data/wan_latents

``--config`` takes the pipeline, the CSV (``data.path``) and the sizes (``data.num_frames`` /
``data.image_size`` or each row at its ``data.buckets`` size) from a training config. Images for Flux
and SD3 are 1-frame clips.

Clips or images for a diffusers family's transformer trained without its pipeline folder (``model.path``),
with the family's VAE and one text encoder given folder by folder:

    python scripts/extract_latents.py --family wan --csv /data/clips.csv --vae-path /models/wan/vae \\
        --text-encoder-path /models/wan/text_encoder --tokenizer-path /models/wan/tokenizer --output /data/wan

``--family`` takes wan, cogvideox, hunyuan_video (or hunyuanvideo), ltx_video (or ltx), flux or sd3
(or the transformer class name); ``--config`` takes it from a training config's ``model.name``
instead. ``--pipeline-path`` is a folder laid out as a pipeline's: the VAE from its ``vae/`` and the
text encoder the family's transformer reads (T5 / UMT5 / Llama; ``text_encoder_2/`` for Flux,
``text_encoder_3/`` for SD3) with its tokenizer (a whole pipeline folder, with model_index.json, is
extracted as ``--pipeline``); ``--vae-path``, ``--text-encoder-path`` and ``--tokenizer-path`` name
the folders one by one. The CSV has ``path`` and ``text`` columns (videos
or images; Flux and SD3 take the first frame). Each clip becomes ``<output>/<row>.pt`` with its
latents [C, T, h, w] (normalised as the family's pipeline expects, see
``opendit_lite/families/<family>/encoding.py``), caption states [tokens, width] and mask. Nothing is
downloaded; folders must hold .safetensors weights. Errors print one paragraph and exit with code 2.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opendit_lite.utils.exit_codes import exit_at_once_on_stop_signals, heavy_imports, script_main  # noqa: E402

if __name__ == "__main__":
    exit_at_once_on_stop_signals()  # a Ctrl-C or SIGTERM during the imports below: exit 130 at once

# No torch at import: the arguments, paths and config are checked before torch and the encoders
# are imported (seconds), inside the functions that need them.
from opendit_lite.config import ConfigError, check_sections, read_yaml  # noqa: E402
from opendit_lite.config.paths import check_output_path  # noqa: E402
from opendit_lite.config.video_schema import VideoTrainConfig  # noqa: E402
from opendit_lite.interop import check_pretrained_folder  # noqa: E402
from opendit_lite.utils.options import OptionParser  # noqa: E402


def _launch():
    """(whether a process group was started here, rank, world size, device): the group torchrun asks for
    is started unless one is up; the rank's own GPU, else the CPU."""
    import torch
    import torch.distributed as dist

    from opendit_lite.distributed.process_group import init_distributed

    created = not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1  # under torchrun
    if created:
        init_distributed()
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else "cpu"
    return created, rank, world, device


def _check_output(output: str) -> None:
    if os.path.lexists(output) and not os.path.isdir(output):
        raise ConfigError(f"--output {output!r} is an existing file; give a folder for the latents.")
    check_output_path(output, "--output", folder=True)  # a file above it, or a folder this user cannot write to


# ---------------------------------------------------------------------------------------- images

def extract_images(args) -> int:
    if not os.path.isdir(args.data_path or ""):
        raise ConfigError(f"--data-path {args.data_path!r} is not a folder; give an image folder with one "
                          f"sub-folder per class.")
    check_pretrained_folder(args.vae_path, f"--vae-path {args.vae_path!r}")
    with heavy_imports():
        import torch
        from torch.utils.data import DataLoader
        from tqdm import tqdm

        from opendit_lite.data import build_image_folder
        from opendit_lite.data.latents import write_latent_meta, write_latent_shard
        from opendit_lite.encoders import load_vae, vae_encode

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dataset = build_image_folder(args.data_path, args.image_size, random_flip=False)
    except ValueError as e:
        raise ConfigError(f"--data-path: {e}") from None
    vae = load_vae(args.vae_path, device=device)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, num_workers=args.num_workers)
    os.makedirs(args.output, exist_ok=True)

    buf_x, buf_y, shard, count = [], [], 0, 0
    for images, labels in tqdm(loader, desc="encoding", unit="batch"):
        z = vae_encode(vae, images.to(device), args.scale_factor, sample=not args.mode)
        buf_x.append(z.float().cpu())
        buf_y.append(labels)
        count += len(labels)
        if sum(len(y) for y in buf_y) >= args.shard_size:
            write_latent_shard(args.output, shard, torch.cat(buf_x), torch.cat(buf_y))
            buf_x, buf_y, shard = [], [], shard + 1
    if buf_y:
        write_latent_shard(args.output, shard, torch.cat(buf_x), torch.cat(buf_y))
    c, h, w = z.shape[1:]
    write_latent_meta(args.output, {"channels": c, "height": h, "width": w, "count": count,
                                    "scale_factor": args.scale_factor, "classes": dataset.classes,
                                    "image_size": args.image_size})
    print(f"wrote {count} latents [{c}, {h}, {w}] to {args.output}")
    return count


# ------------------------------------------------------------------------------------- pipelines

def _pipeline_config(args):
    """The training config whose pipeline, CSV and sizes the extraction takes (``--config``, or one made
    from ``--pipeline``, ``--csv`` and the sizes), checked as train_video.py checks it."""
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig

    if args.config:
        cfg = load_config(args.config, [], schema=VideoTrainConfig)
        if cfg.data.type not in ("csv", "folder") and not args.csv:
            raise ConfigError(f"--config {args.config!r} trains on data.type={cfg.data.type}; extraction reads the "
                              f"captioned images or clips of a CSV or of media folders: set data.type=csv or folder "
                              f"and data.path there, or give --csv.")
        if args.csv:
            cfg.data.type, cfg.data.path = "csv", args.csv
    else:
        overrides = [f"model.pipeline={args.pipeline}", "data.type=csv", f"data.path={args.csv}",
                     f"data.frame_interval={args.frame_interval}"]
        if args.pipeline_class:
            overrides.append(f"model.pipeline_class={args.pipeline_class}")
        if args.height != args.width:  # one rectangular size: a bucket of it
            overrides.append(f"data.buckets=[{{frames: {args.num_frames}, height: {args.height}, width: {args.width}, "
                             f"batch_size: 1}}]")
        else:
            overrides += [f"data.num_frames={args.num_frames}", f"data.image_size={args.height}"]
        cfg = load_config(None, overrides, schema=VideoTrainConfig)
    if cfg.data.type == "csv" and (cfg.data.path is None or not os.path.isfile(cfg.data.path)):
        raise ConfigError(f"the CSV {cfg.data.path!r} is not a file; give a CSV with 'path' and 'text' columns.")
    for name in ("batch_size",):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
    with heavy_imports():
        from opendit_lite.builders.pipeline import resolve_pipeline
    resolve_pipeline(cfg)
    return cfg


def _names_pipeline(config: str) -> bool:
    """Whether the training config ``config`` trains from a pipeline folder (``model.pipeline``)."""
    tree = read_yaml(config)
    return isinstance(tree, dict) and bool((tree.get("model") or {}).get("pipeline"))


def _row_sizes(cfg, csv) -> list:
    """Each row's pixel size (frames, height, width): its bucket's (rows that fit none: None), or the one size."""
    from opendit_lite.builders.video import video_buckets
    from opendit_lite.data.buckets import assign_bucket

    buckets = video_buckets(cfg)
    if not buckets:
        d = cfg.data
        return [(d.num_frames, d.image_size, d.image_size)] * len(csv)
    picks = [assign_bucket(buckets, shape) for shape in csv.sample_shapes]
    return [None if j is None else buckets[j].shape for j in picks]


def extract_pipeline(args, cfg) -> int:
    """Encode this rank's share of the CSV with the pipeline's encoders (``PipelineEncoders``, the CSV
    route's own); returns the number of clips written by all ranks."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from opendit_lite.builders.pipeline import (
        PipelineEncoders,
        check_conditioning_rows,
        conditioning_images,
        run_pipeline_folder,
    )
    from opendit_lite.data.latent_shards import LatentShardWriter
    from opendit_lite.data.video_csv import media_dataset
    from opendit_lite.data.video_latents import PIPELINE_FORMAT
    from opendit_lite.encoders.pipeline_folder import pipeline_fingerprint

    folder = run_pipeline_folder(cfg)
    conditioned = folder.conditioning.image_input != "none"
    try:
        csv = media_dataset(cfg.data.type, cfg.data.path, cfg.data.num_frames or 1, cfg.data.frame_interval,
                            cfg.data.image_size or 1, random_start=False, images=conditioning_images(folder),
                            require_captions=cfg.data.require_captions)
        check_conditioning_rows(folder, cfg.data.path, csv.image_paths, csv.where)
        sizes = _row_sizes(cfg, csv)
    except ValueError as e:
        raise ConfigError(f"data.path {cfg.data.path!r}: {e}") from None
    created, rank, world, device = _launch()
    try:
        start = time.time()
        encoders = PipelineEncoders(folder, device)
        rows = [i for i in range(rank, len(csv), world) if sizes[i] is not None]     # this rank's share
        groups = {}
        for i in rows:
            groups.setdefault(sizes[i], []).append(i)
        os.makedirs(args.output, exist_ok=True)
        writer = LatentShardWriter(args.output, rank)
        for size, members in groups.items():  # one pixel size per batch
            loader = DataLoader(_Rows(csv, members, *size), batch_size=args.batch_size, num_workers=args.num_workers,
                                collate_fn=_collate_images if conditioned else None)
            try:
                for index, clips, captions, *images in loader:  # images: per sample its conditioning images
                    # latents [B, C, T, h, w], {key: [B, ...]}: text, and the images' inputs
                    latents, text = encoders.encode(clips, list(captions), *images)
                    for j in range(len(index)):
                        writer.write(int(index[j]), latents[j], {k: v[j] for k, v in text.items()}, captions[j])
            except ValueError as e:  # a clip too short or unreadable
                raise ConfigError(f"data.path {cfg.data.path!r}: {e}") from None
        parts = [writer.close()]
        if world > 1:  # every rank's part, once all are written
            gathered = [None] * world
            dist.all_gather_object(gathered, parts[0])
            parts = gathered
        count = torch.tensor([sum(len(part["rows"]) for part in parts)])
        if rank == 0:
            write_shard_meta(args.output, parts, sizes, encoders.null_text(), {
                "format": PIPELINE_FORMAT, "family": folder.family.name, "transformer": folder.family.class_name,
                "pipeline": os.path.abspath(folder.path), "pipeline_class": folder.pipeline_class,
                "fingerprint": pipeline_fingerprint(folder.path),
                "text_tokens": cfg.text_encoder.max_length, "posterior": "mean"})
            skipped = sum(size is None for size in sizes)
            print(f"wrote {int(count.item())} {folder.family.name} clips from {folder.pipeline_class} at "
                  f"{', '.join('x'.join(map(str, s)) for s in sorted(groups))} pixels to {args.output} on {world} "
                  f"rank(s) in {time.time() - start:.1f} s" + (f" ({skipped} rows fit no bucket)" if skipped else ""))
        return int(count.item())
    finally:
        if created:
            dist.destroy_process_group()


def write_shard_meta(out: str, parts, sizes, null_text, meta: dict) -> None:
    """Rank 0: merge the ranks' shard parts into one dataset and write its meta.json (``meta`` plus the
    count, storage, each sample's pixel size in the dataset's order, the tensors' dtypes) and null text."""
    from opendit_lite.data.latent_shards import STORAGE, merge_parts, save_null_text_shards
    from opendit_lite.data.video_latents import write_video_latent_meta

    rows, dtypes = merge_parts(out, parts)
    sample_sizes = [list(sizes[row]) for row in rows]
    save_null_text_shards(out, null_text)
    write_video_latent_meta(out, {**meta, "storage": STORAGE, "count": len(rows), "rows": rows,
                                  "sample_sizes": sample_sizes, "dtypes": dtypes,
                                  "pixel_sizes": sorted({tuple(s) for s in sample_sizes})})


def convert_to_shards(args) -> int:
    """``--convert <folder> --output <out>``: a folder of one ``.pt`` file per clip (the pipeline route's
    former format, read with ``weights_only=True``) as shards, with its meta.json carried over."""
    from opendit_lite.data.latent_shards import LatentShardWriter
    from opendit_lite.data.video_latents import (
        PIPELINE_FORMAT,
        PipelineLatentDataset,
        load_null_text,
        video_latent_meta,
    )

    meta = video_latent_meta(args.convert)
    if meta.get("format") != PIPELINE_FORMAT:
        raise ConfigError(f"--convert {args.convert!r} holds no latents extracted from a pipeline (its meta.json does "
                          f"not say format={PIPELINE_FORMAT!r}); extract them with --pipeline instead.")
    try:
        dataset = PipelineLatentDataset(args.convert, meta.get("files", {}))
    except ValueError as e:
        raise ConfigError(f"--convert: {e}.") from None
    os.makedirs(args.output, exist_ok=True)
    writer = LatentShardWriter(args.output, 0)
    sizes = {}
    for i in range(len(dataset)):
        latents, text, caption = dataset[i]
        row = int(os.path.splitext(os.path.basename(dataset.files[i]))[0])
        sizes[row] = dataset.sizes[i]
        writer.write(row, latents, text, caption)
    kept = {k: v for k, v in meta.items() if k not in ("files", "count", "pixel_sizes")}
    write_shard_meta(args.output, [writer.close()], sizes, load_null_text(args.convert), kept)
    print(f"converted {len(dataset)} clips of {args.convert} to shards in {args.output}")
    return len(dataset)


# -------------------------------------------------------------------------------------- families

class _Rows:
    """Rows ``rows`` of the CSV, each read as a ``frames`` x ``height`` x ``width`` clip (a map-style
    dataset for torch's DataLoader)."""

    def __init__(self, csv_dataset, rows, frames: int, height: int, width: int):
        self.csv, self.rows, self.size = csv_dataset, rows, (frames, height, width)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        return (row, *self.csv[(row, *self.size)])  # (row, clip, caption[, conditioning images])


def _collate_images(items):
    """Batches of ``(row, clip, caption, images)``: the images as one list per sample (sizes may differ)."""
    import torch

    rows, clips, captions, images = zip(*items)
    return torch.tensor(rows), torch.stack(clips), list(captions), [list(i) for i in images]


def _family_name(args) -> str:
    if args.family:
        return args.family
    tree = read_yaml(args.config)  # a missing, unreadable or non-mapping file: one paragraph
    check_sections(tree, f"config file '{args.config}'", VideoTrainConfig)
    name = (tree.get("model") or {}).get("name")
    if not name:
        raise ConfigError(f"--config {args.config!r} has no model.name; give the family with --family.")
    return name


def _folders(args, spec) -> tuple:
    """(VAE, text encoder, tokenizer) folders from --pipeline-path and the per-folder options."""
    text, tokenizer = spec.text_folders
    base = args.pipeline_path
    if base is not None and not os.path.isdir(base):
        raise ConfigError(f"--pipeline-path {base!r} is not a folder; give a local diffusers pipeline folder "
                          f"(with vae/, {text}/ and {tokenizer}/).")
    vae = args.vae_path or (os.path.join(base, "vae") if base else None)
    encoder = args.text_encoder_path or (os.path.join(base, text) if base else None)
    tokens = args.tokenizer_path or (os.path.join(base, tokenizer) if base and not args.text_encoder_path else None)
    if vae is None or encoder is None:
        raise ConfigError("--family needs the VAE and the text encoder: give --pipeline-path (a local diffusers "
                          "pipeline folder) or --vae-path and --text-encoder-path.")
    check_pretrained_folder(vae, f"the VAE folder {vae!r}")
    check_pretrained_folder(encoder, f"the text encoder folder {encoder!r}")
    return vae, encoder, tokens or encoder


def extract_family(args) -> int:
    """Encode this rank's share of the CSV with the family's VAE and text encoder; returns the
    number of clips written by all ranks."""
    name = _family_name(args)
    if not args.csv or not os.path.isfile(args.csv):
        raise ConfigError(f"--csv {args.csv!r} is not a file; give a CSV with 'path' and 'text' columns.")
    for option in ("num_frames", "height", "width", "batch_size", "frame_interval"):
        if getattr(args, option) < 1:
            raise ConfigError(f"--{option.replace('_', '-')} must be at least 1, got {getattr(args, option)}.")
    with heavy_imports():
        import torch.distributed as dist

        from opendit_lite.data.video_csv import VideoCSVDataset
        from opendit_lite.families import find_family

    found = find_family(name)
    family, spec = found.name, found.encoding
    vae_path, encoder_path, tokenizer_path = _folders(args, spec)
    frames = 1 if spec.image_only else args.num_frames
    try:
        csv = VideoCSVDataset(args.csv, num_frames=frames, frame_interval=args.frame_interval,
                              image_size=args.height, random_start=False)
    except ValueError as e:
        raise ConfigError(f"--csv: {e}") from None

    created, rank, world, device = _launch()
    try:
        return _extract_rows(args, family, spec, csv, frames, rank, world, device,
                             (vae_path, encoder_path, tokenizer_path))
    finally:
        if created:
            dist.destroy_process_group()


def _extract_rows(args, family, spec, csv, frames, rank, world, device, folders) -> int:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from opendit_lite.data.video_latents import save_video_latents, write_video_latent_meta
    from opendit_lite.encoders.family_encoders import encode_family_latents, load_family_text_encoder, load_family_vae

    vae_path, encoder_path, tokenizer_path = folders
    torch.manual_seed(args.seed + rank)
    vae = load_family_vae(spec, vae_path, f"the VAE folder {vae_path!r}", device=device)
    text = load_family_text_encoder(spec, encoder_path, f"the text encoder folder {encoder_path!r}",
                                    max_length=args.max_length, device=device, tokenizer_path=tokenizer_path)
    rows = list(range(rank, len(csv), world))                                   # this rank's share
    loader = DataLoader(_Rows(csv, rows, frames, args.height, args.width), batch_size=args.batch_size,
                        num_workers=args.num_workers)
    os.makedirs(args.output, exist_ok=True)
    start, shapes = time.time(), set()
    try:
        for index, clips, captions in loader:
            latents = encode_family_latents(spec, vae, clips.to(device), sample=not args.mode)  # [B, C, T, h, w]
            states, mask = text.encode(list(captions))                                              # [B, M, W], [B, M]
            for i in range(len(index)):
                save_video_latents(args.output, int(index[i]), latents[i], states[i].float(), mask[i], captions[i])
            shapes.add((tuple(latents.shape[1:]), tuple(states.shape[1:])))
    except ValueError as e:  # a clip too short or unreadable
        raise ConfigError(f"--csv: {e}") from None
    count = torch.tensor([len(rows)])
    if world > 1:
        dist.all_reduce(count)  # also waits for every rank's files
    count = int(count.item())
    if rank == 0:
        (latent_shape, state_shape), = shapes or {((), ())}
        write_video_latent_meta(args.output, {
            "family": family, "transformer": spec.transformer, "count": count, "latent_shape": list(latent_shape),
            "text_tokens": state_shape[0] if state_shape else None,
            "text_width": state_shape[1] if state_shape else None, "vae": vae_path, "text_encoder": encoder_path,
            "posterior": "mean" if args.mode else "sample"})
        print(f"wrote {count} {family} clips (latents {list(latent_shape)}) to {args.output} on {world} "
              f"rank(s) in {time.time() - start:.1f} s")
    return count


def find_family_name(name: str) -> str:
    from opendit_lite.families import find_family

    return find_family(name).class_name


@script_main
def main(argv=None):
    p = OptionParser(prog="python scripts/extract_latents.py", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", required=True, help="folder for the latent files and meta.json")
    p.add_argument("--data-path", help="images for our DiT: a folder with one sub-folder per class")
    p.add_argument("--vae-path", help="local diffusers VAE folder (AutoencoderKL for images; the family's VAE)")
    p.add_argument("--image-size", type=int, default=256, help="images for our DiT: side after the centre crop")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--shard-size", type=int, default=4096, help="images for our DiT: latents per shard file")
    p.add_argument("--scale-factor", type=float, default=0.18215, help="images for our DiT: latent scale")
    p.add_argument("--mode", action="store_true", help="store the posterior mean instead of a sample")
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    family = p.add_argument_group("diffusers families")
    family.add_argument("--family", help="wan, cogvideox, hunyuan_video, ltx_video, flux or sd3 (or a transformer "
                                                "class)")
    family.add_argument("--config", help="a training config whose model.name gives the family")
    family.add_argument("--csv", help="CSV with 'path' and 'text' columns (videos or images)")
    family.add_argument("--pipeline", help="local diffusers pipeline folder (model_index.json): its VAE and text "
                                           "encoders, as a run with model.pipeline trains")
    family.add_argument("--pipeline-class", help="with --pipeline: the pipeline class to load the folder as (as "
                                                 "model.pipeline_class: WanImageToVideoPipeline for the Wan 2.2 "
                                                 "TI2V-5B folder's image-to-video); default: the folder's own")
    family.add_argument("--pipeline-path", help="a folder laid out as a pipeline's (vae/, text encoder, tokenizer); "
                                                "a whole pipeline folder is extracted as --pipeline")
    family.add_argument("--text-encoder-path", help="local text encoder folder (default: from --pipeline-path)")
    family.add_argument("--tokenizer-path", help="local tokenizer folder (default: the pipeline's, or the encoder's)")
    family.add_argument("--num-frames", type=int, default=17, help="frames per clip (Flux and SD3: 1)")
    family.add_argument("--frame-interval", type=int, default=1, help="take every N-th frame of a video")
    family.add_argument("--height", type=int, default=256, help="clip height in pixels (resize to cover, centre crop)")
    family.add_argument("--width", type=int, default=256, help="clip width in pixels")
    family.add_argument("--max-length", type=int, help="caption tokens (default: the family pipeline's)")
    family.add_argument("--convert", help="a folder of per-clip .pt latents extracted from a pipeline: write it as "
                                          "shards to --output")
    args = p.parse_args(argv)
    _check_output(args.output)
    if args.convert:
        return convert_to_shards(args)
    whole = args.pipeline_path and os.path.isfile(os.path.join(args.pipeline_path, "model_index.json"))
    if args.pipeline_class and not (args.pipeline or whole):
        raise ConfigError("--pipeline-class loads a --pipeline folder as another of its family's pipelines; give "
                          "--pipeline (with --config, set model.pipeline_class in the config instead).")
    if args.pipeline or whole:
        if args.pipeline and args.pipeline_path:
            raise ConfigError("give the pipeline once: --pipeline or --pipeline-path, not both.")
        if args.config or args.data_path or args.vae_path or args.text_encoder_path or args.tokenizer_path:
            raise ConfigError("--pipeline encodes with the pipeline's own VAE and text encoders and reads --csv: "
                              "remove --config, --data-path, --vae-path, --text-encoder-path and --tokenizer-path.")
        args.pipeline = args.pipeline or args.pipeline_path
        cfg = _pipeline_config(args)
        if args.family and find_family_name(args.family) != cfg.model.name:
            raise ConfigError(f"--family {args.family} is not the family of the pipeline {args.pipeline!r} "
                              f"({cfg.model.name}): remove --family (it is read from the pipeline).")
        return extract_pipeline(args, cfg)
    if args.config and not args.family and _names_pipeline(args.config):
        return extract_pipeline(args, _pipeline_config(args))
    if args.family or args.config:
        if args.data_path:
            raise ConfigError("--data-path is the image-folder mode for our DiT; a family reads --csv.")
        if args.family and args.config:
            raise ConfigError("give the family once: --family or --config, not both.")
        return extract_family(args)
    if args.csv or args.pipeline_path:
        raise ConfigError("--csv and --pipeline-path need --family (or --config naming a diffusers family's model).")
    if not args.data_path or not args.vae_path:
        raise ConfigError("give --data-path and --vae-path (images for our DiT), or --family with --csv (a diffusers "
                          "family's clips).")
    return extract_images(args)


if __name__ == "__main__":
    main()
