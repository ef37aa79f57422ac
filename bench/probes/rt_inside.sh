#!/bin/bash
# rt_inside.sh OUTDIR -- prepared in the thirty-sixth session, not yet run
# on a GPU: bench/probes/rt_inside.patch pads the relative table (issue
# 33, item 5) to tiles of 256 (rows; keys and a tile past, the mma
# family's) so that every tile's distance lies in it: the plans prove
# table_inside at once and the kernels read the table at the row pointer
# with no test.  Without the proof the table's backward took 457 us on
# the H100 against the relative bias's 388 (its proof held), forward
# alike (149 both).  Predicted: the lookup's and T5's backward at the
# relative bias's, 385-400 us at (2, 16, 2048, 128) bf16.
# Build on the CPU first:  git apply bench/probes/rt_inside.patch && cmake
# --build build && (slim build/ as build-c, carry it) && git checkout .
# Then, from the repository root with main's build as build/ and that one
# as build-rt/ (both slimmed; about 38 MB carried):
#   bash bench/probes/s37a.sh $OUT      # fix, rtin, ab
# and land the patch where the tests pass and the backward meets the
# prediction.
exec bash bench/probes/s37a.sh "$@"
