"""Per-layer communication volume of sequence-parallel schemes for the model zoo's shapes, from the
formulas in docs/sequence_parallel.md (no measurement: nothing here needs a GPU).

    python benchmarks/sp_comm_volume.py                 # markdown table, bf16, one sample per GPU
    python benchmarks/sp_comm_volume.py --batch 4 --bytes 4

Volume = bytes one GPU sends in one layer for one training step (forward + backward), per sample
of its micro-batch. With P GPUs in the SP group, N tokens and width D:

* Ulysses (ours):        all-to-all q, k, v and the output, forward and backward
                         -> 8 N D (P - 1) / P^2 elements; needs P | heads.
* all-gather K, V:       every GPU gathers the full K and V for its query shard (Megatron-LM
                         context parallelism without the ring), reduce-scatters dK, dV
                         -> 4 N D (P - 1) / P elements; no head constraint.
* DSP:                   for spatial-temporal blocks only: shard frames during spatial attention,
                         spatial positions during temporal attention, and switch with one
                         all-to-all of the hidden states at each change of stage
                         -> 4 N D (P - 1) / P^2 per spatial + temporal block pair; counted only
                         when P divides T and S (otherwise an axis is padded).

For STDiT a "layer" is one spatial + temporal block pair. Ulysses and all-gather shard the spatial
tokens, so temporal attention is local and cross-attention needs no communication either.
"""

import argparse
from dataclasses import dataclass
from typing import List, Optional

SP_SIZES = (8, 16, 64)


@dataclass(frozen=True)
class Shape:
    name: str
    frames: int          # T (1 for images)
    spatial_tokens: int  # S = (H / p) * (W / p) of the latent
    hidden: int          # D
    heads: int

    @property
    def tokens(self) -> int:
        return self.frames * self.spatial_tokens


# 256/512 px images -> 32x32/64x64 SD-VAE latents -> 2x2 patches; STDiT: 16 frames of 256x256.
SHAPES = [
    Shape("DiT-XL/2 256px", 1, (32 // 2) * (32 // 2), 1152, 16),
    Shape("DiT-XL/2 512px", 1, (64 // 2) * (64 // 2), 1152, 16),
    Shape("STDiT-XL/2 16x256x256", 16, (32 // 2) * (32 // 2), 1152, 16),
]


def ulysses_elements(s: Shape, p: int) -> Optional[float]:
    if s.heads % p or s.spatial_tokens < p:
        return None
    return 8 * s.tokens * s.hidden * (p - 1) / p**2


def allgather_kv_elements(s: Shape, p: int) -> Optional[float]:
    if s.spatial_tokens < p:
        return None
    return 4 * s.tokens * s.hidden * (p - 1) / p


def dsp_elements(s: Shape, p: int) -> Optional[float]:
    if s.frames == 1 or s.frames % p or s.spatial_tokens % p:
        return None  # one sequence axis: nothing to switch between; or T or S would be padded
    return 4 * s.tokens * s.hidden * (p - 1) / p**2


SCHEMES = [("Ulysses", ulysses_elements), ("all-gather K,V", allgather_kv_elements), ("DSP", dsp_elements)]


def human(num_bytes: Optional[float]) -> str:
    if num_bytes is None:
        return "n/a"
    if num_bytes < 1024:
        return f"{num_bytes:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        num_bytes /= 1024
        if num_bytes < 1024 or unit == "GiB":
            return f"{num_bytes:.1f} {unit}"


def table(batch: int, bytes_per_element: int) -> List[str]:
    header = ["model", "N", "P"] + [name for name, _ in SCHEMES] + ["Ulysses / all-gather"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in SHAPES:
        for p in SP_SIZES:
            values = [fn(s, p) for _, fn in SCHEMES]
            volumes = [None if v is None else v * batch * bytes_per_element for v in values]
            ratio = "n/a" if None in values[:2] else f"{values[0] / values[1]:.3f}"
            cells = [s.name, str(s.tokens), str(p)] + [human(v) for v in volumes] + [ratio]
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1, help="samples per GPU micro-batch")
    parser.add_argument("--bytes", type=int, default=2, help="bytes per element (2: bf16/fp16, 4: fp32)")
    args = parser.parse_args()
    print(f"Per-GPU bytes sent per layer per training step (forward + backward), batch {args.batch}, "
          f"{args.bytes} bytes per element. n/a: the scheme cannot use that many GPUs for that shape.\n")
    print("\n".join(table(args.batch, args.bytes)))


if __name__ == "__main__":
    main()
