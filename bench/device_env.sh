# device_env.sh -- sourced by the device scripts (device_check.sh,
# probes/pending.sh), from the repository root with build/ carried: the
# build folder was configured at /work/main on the build machine, and
# ctest and the tests find their files there, so the tree is linked there
# when it is elsewhere; the caches and the CUDA libraries; then build/.
root=$(pwd)
if [ "$root" != /work/main ] && [ ! -e /work/main ]; then
  mkdir -p /work && ln -s "$root" /work/main
fi
export FLASHJIT_CACHE_DIR=/tmp/fj-cache FJT_DATA_DIR=/work/main/tests/data
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cd /work/main/build || exit 1
