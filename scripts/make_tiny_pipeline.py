"""Build a tiny random diffusers pipeline of a released model's layout and save it, so that the
fine-tuning path (extract, train, export, load the LoRA in the pipeline) runs anywhere, offline:

    python scripts/make_tiny_pipeline.py --family flux --out /tmp/tiny-flux
    python -c "from diffusers import DiffusionPipeline; DiffusionPipeline.from_pretrained('/tmp/tiny-flux')"

--family is one of wan (Wan 2.1), wan22 (Wan 2.2 A14B, two experts), hunyuanvideo, cogvideox, ltx,
flux (dev) or sd3. The folder holds what the release's holds (model_index.json, transformer/,
vae/, scheduler/, every text encoder and tokenizer) at test size, random weights drawn from
--seed; its pipeline's ``__call__`` runs in seconds on a CPU at 32x32 pixels (and 5-9 frames).
Nothing is downloaded. An existing non-empty --out is refused unless --overwrite is given. Errors
print one paragraph and exit with code 2.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opendit_lite.utils.exit_codes import exit_at_once_on_stop_signals, heavy_imports, script_main  # noqa: E402

if __name__ == "__main__":
    exit_at_once_on_stop_signals()  # a Ctrl-C or SIGTERM during the imports below: exit 130 at once

# No torch at import: the options and the output folder are checked first; the families (torch) are
# imported after them, and name the pipelines they can build.
from opendit_lite.config.paths import check_output_path  # noqa: E402
from opendit_lite.utils.options import OptionParser  # noqa: E402


@script_main
def main(argv=None):
    p = OptionParser(prog="python scripts/make_tiny_pipeline.py", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True, help="the name of a tiny pipeline (an unknown name "
                                                       "lists them)")
    p.add_argument("--out", required=True, help="folder to write the pipeline to (new or empty)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--overwrite", action="store_true", help="replace what a non-empty --out holds")
    args = p.parse_args(argv)
    check_output_path(args.out, "--out", folder=True)  # a file above it, or a folder this user cannot write to
    with heavy_imports():
        from opendit_lite.families.tiny_pipelines import save_tiny_pipeline
    start = time.time()
    save_tiny_pipeline(args.family, args.out, seed=args.seed, overwrite=args.overwrite)
    print(f"wrote a tiny {args.family} pipeline to {args.out} in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    main()
