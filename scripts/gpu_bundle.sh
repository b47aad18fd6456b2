#!/usr/bin/env bash
# Fill .whl/ with the wheels that the offline GPU machine's image lacks, for Python 3.12 on x86-64
# Linux, so that `make gpu-report` can install them there without a network (docs/gpu.md).
#
# The image already holds torch, triton, timm, transformers, peft, accelerate, safetensors, einops,
# numpy, pyyaml, tqdm, rich, psutil, ninja, scipy, matplotlib and pytest. It lacks:
#   colossalai        built here from its sdist with BUILD_EXT=0: pure Python, no CUDA extensions
#                     (its CUDA optimizers compile just in time on first use there)
#   its start-up imports: pydantic, pydantic-core, annotated-types, typing-inspection, contexttimer,
#                     galore-torch and bitsandbytes (galore-torch imports it; colossalai.nn.optimizer
#                     imports galore-torch), and a typing-extensions as new as pydantic needs
#   diffusers         the families and the Wan-shaped planner check
#   torchao           float8 training (train_step.py --precision fp8); 0.17 is the release built
#                     against torch 2.11, the image's
#
# Versions: those of requirements*.txt where they pin the package (one source of truth), else the
# pins below. Run from the project root on a machine with the package registries:
#
#     bash scripts/gpu_bundle.sh            # fills .whl/, prints its size; exit 1 names a missing wheel
#     bash scripts/gpu_bundle.sh DIR        # another folder
#
# The bundle travels with the working tree (64 MiB in all), so it must stay under 60 MiB: the script
# fails when it does not.
set -euo pipefail

out=${1:-.whl}
limit_mib=60
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}

# NAME==VERSION as pinned in requirements.txt or requirements-colossalai.txt.
pin() {
  local line
  line=$(grep -hiE "^$1==" "$root/requirements.txt" "$root/requirements-colossalai.txt" | head -n1 || true)
  [ -n "$line" ] || { echo "error: $1 is not pinned in requirements.txt or requirements-colossalai.txt" >&2; exit 2; }
  echo "$line"
}

# Binary wheels (manylinux or pure Python) for CPython 3.12.
BINARY=(
  "$(pin diffusers)" "$(pin pydantic)" "$(pin galore-torch)" "$(pin bitsandbytes)"
  pydantic-core==2.50.4      # the exact version pydantic 2.14.3 requires
  annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  torchao==0.17.0
)
# Built here from source: colossalai without its CUDA extensions, and contexttimer (sdist only).
SOURCE=("$(pin colossalai)" "$(pin contexttimer)")
# Module-file prefix of every wheel that must be there at the end.
EXPECTED=(colossalai contexttimer pydantic pydantic_core annotated_types typing_inspection typing_extensions
          galore_torch bitsandbytes diffusers torchao)

mkdir -p "$out"
if [ -d "$root/.git" ] && ! grep -qsx '/.whl/' "$root/.gitignore" "$root/.git/info/exclude"; then
  echo '/.whl/' >> "$root/.git/info/exclude"
fi
rm -f "$out"/*.whl  # one version of each: two copies of a package stop the offline install

quiet() { "$@" 2>&1 | { grep -v '^WARNING: Location' || true; }; }

echo "downloading ${#BINARY[@]} wheels for cp312 manylinux x86_64 into $out"
quiet "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out" "${BINARY[@]}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "building ${SOURCE[*]} from source (BUILD_EXT=0: no CUDA extensions)"
quiet "$py" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" "${SOURCE[@]}"
BUILD_EXT=0 quiet "$py" -m pip wheel -q --no-deps -w "$out" "$tmp"/*.tar.gz

missing=()
for name in "${EXPECTED[@]}"; do
  ls "$out/$name"-*.whl >/dev/null 2>&1 || missing+=("$name")
done
ls -l "$out"/*.whl | awk '{printf "  %8.1f MiB  %s\n", $5 / 1048576, $NF}'
total=$(cat "$out"/*.whl | wc -c)
echo "bundle: $(ls "$out"/*.whl | wc -l) wheels, $(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }') MiB (limit $limit_mib MiB)"
if [ ${#missing[@]} -gt 0 ]; then
  echo "error: missing wheel(s): ${missing[*]}" >&2
  exit 1
fi
if [ "$total" -gt $((limit_mib * 1048576)) ]; then
  echo "error: the bundle is over $limit_mib MiB: it would not travel with the working tree" >&2
  exit 1
fi
