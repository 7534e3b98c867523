#!/usr/bin/env bash
# Installs the build into a temporary prefix as `make install` does (stripped) and checks the
# layout the README promises: the library (no debug sections), its header, the launcher (which
# finds the library from bin/), the demo where the build has it, and the license.
#   test_install.sh CMAKE BUILD_DIR SOURCE_LICENSE
set -euo pipefail

CMAKE=$1
BUILD=$2
LICENSE=$3

T=$(mktemp -d)
trap 'rm -rf -- "$T"' EXIT

fail() {
  echo "FAIL [install]: $*"
  exit 1
}

"$CMAKE" --install "$BUILD" --prefix "$T" --strip >"$T/install.log" 2>&1 || {
  cat -- "$T/install.log"
  fail "cmake --install failed"
}
for f in lib/libzerocta.so include/zerocta.h bin/zerocta-run share/doc/zerocta/LICENSE; do
  [[ -f $T/$f ]] || fail "$f is not installed"
done
cmp -s -- "$LICENSE" "$T/share/doc/zerocta/LICENSE" || fail "the installed LICENSE differs"
if command -v readelf >/dev/null; then
  ! readelf -S --wide "$T/lib/libzerocta.so" | grep -q '\.debug_' ||
    fail "the installed library is not stripped"
fi
if [[ -x $BUILD/tools/zerocta-demo ]]; then
  [[ -x $T/bin/zerocta-demo ]] || fail "bin/zerocta-demo is not installed"
fi
# The license: Apache 2.0 in full, under the project's copyright line.
[[ $(head -n1 "$LICENSE") == "Copyright the zerocta authors" ]] ||
  fail "LICENSE does not start with the copyright line"
for phrase in "Apache License" "Version 2.0, January 2004" \
  "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" "END OF TERMS AND CONDITIONS" \
  "APPENDIX: How to apply the Apache License to your work."; do
  grep -qF -- "$phrase" "$LICENSE" || fail "LICENSE lacks '$phrase'"
done
# The installed launcher finds the installed library (../lib from bin/).
out=$(env -u ZEROCTA_LIB "$T/bin/zerocta-run" --dry-run 2>/dev/null | head -n1) || true
[[ $out == "LD_PRELOAD=$(readlink -f -- "$T/lib/libzerocta.so")" ]] ||
  fail "the installed zerocta-run does not find the installed library: $out"
echo "PASS [install]"
