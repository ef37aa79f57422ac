#!/bin/sh
# run.sh CMAKE BUILD_DIR WORK_DIR -- installs the build into a scratch prefix
# and builds and runs tests/consumer against it with find_package(flashjit).
set -e
cmake=$1 build=$2 work=$3
src=$(dirname "$0")
rm -rf "$work"
"$cmake" --install "$build" --prefix "$work/prefix" >/dev/null
"$cmake" -S "$src" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
"$cmake" --build "$work/build" >/dev/null
"$work/build/consumer" | grep "^fj_attn_d64_[a-z0-9_]*_nc_f16: [1-9][0-9]* registers$"
