#!/bin/bash
# compile_cost.sh SRC_DIR [N [EXTRA NVRTC OPTIONS...]] -- where a cold
# compile's time goes, per kernel: NVRTC on each SRC_DIR/<arch>__<name>.cu
# (bench/pick_sources.c writes them) with the library's options
# (src/compile.c's fj__nvrtc_options: -default-device -std=c++17 -lineinfo
# -Xptxas -v --no-cache -I<cuda>/include --gpu-architecture=<arch>) plus
# EXTRA, N fresh programs each (default 5), one process per kernel; NVRTC's
# own --time table gives the phases.  Prints a markdown table: the kernel,
# the median total ms (lowest-highest), then the medians of the front end,
# the NVVM optimiser (with its code generation) and the PTX translation
# (ptxas).  Needs /tmp/nvrtc_time (bench/nvrtc_time.c), or NVRTC_TIME.
#
#   cc -O2 bench/nvrtc_time.c -I/usr/local/cuda/include \
#      -L/usr/local/cuda/lib64 -lnvrtc -o /tmp/nvrtc_time
#   bash bench/compile_cost.sh /tmp/srcs 5
set -u
dir=$1 n=${2:-5}
shift $(($# < 2 ? $# : 2))
tool=${NVRTC_TIME:-/tmp/nvrtc_time}
cuda=${CUDA_HOME:-/usr/local/cuda}
base="-default-device -std=c++17 -lineinfo -Xptxas -v --no-cache -I$cuda/include"
echo "| kernel | arch | total ms (range) | front end | NVVM | ptxas |"
echo "|---|---|---|---|---|---|"
for f in "$dir"/*__*.cu; do
  b=$(basename "$f" .cu)
  arch=${b%%__*} name=${b#*__}
  r=$("$tool" -n "$n" --phases "$f" $base --gpu-architecture="$arch" "$@" 2>&1 | tail -1)
  tot=$(sed -E 's/^([0-9.]+) ms.*/\1/' <<<"$r")
  rng=$(sed -E 's/.*; ([0-9.]+-[0-9.]+)\).*/\1/' <<<"$r")
  fe=$(grep -oE 'Frontend [0-9.]+' <<<"$r" | cut -d' ' -f2)
  opt=$(grep -oE 'Optimizer [0-9.]+' <<<"$r" | cut -d' ' -f2)
  ptx=$(grep -oE 'Translation [0-9.]+' <<<"$r" | cut -d' ' -f2)
  echo "| $name | $arch | $tot ($rng) | ${fe:-?} | ${opt:-?} | ${ptx:-?} |"
done
