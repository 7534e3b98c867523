#!/usr/bin/env bash
# Copies what the GPU runs need from a build directory into a small, stripped tree
# (default .devcarry/build, git-ignored) so it can travel to a GPU host that has no compiler
# toolchain set up for this repository. The full build is far larger than the device tool's
# 64 MiB carry limit; this is about 15 MiB.
#
#   tests/gpu/pack_build_for_device.sh [BUILD] [DEST]
#   # on the GPU host: ZEROCTA_BUILD=$PWD/.devcarry/build tests/gpu/run_gpu_suite.sh OUT
set -euo pipefail
BUILD=${1:-build}
DEST=${2:-.devcarry/build}
rm -rf "$DEST"
mkdir -p "$DEST/tests/gpu" "$DEST/tools"
cp "$BUILD/libzerocta.so" "$DEST/"
for f in "$BUILD"/tests/gpu/zerocta_gpu_*; do
  [ -x "$f" ] && [ -f "$f" ] && cp "$f" "$DEST/tests/gpu/"
done
rm -f "$DEST/tests/gpu/zerocta_gpu_harness_selftest"
for t in zerocta-bench zerocta-demo zerocta-ce-probe zerocta-overhead zerocta-run zerocta-plot; do
  [ -e "$BUILD/tools/$t" ] && cp "$BUILD/tools/$t" "$DEST/tools/"
done
[ -d "$BUILD/null_nccl" ] && cp -r "$BUILD/null_nccl" "$DEST/"
find "$DEST" -type f -exec sh -c 'file -b "$1" | grep -q ELF && strip --strip-debug "$1"' _ {} \;
du -sh "$DEST"
