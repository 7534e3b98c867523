#!/usr/bin/env bash
# Tests of tools/zerocta-run, one CTest per case:
#   test_zerocta_run.sh CASE LAUNCHER STUB_LIB [BUILD_COPY] [REAL_LIB]
# LAUNCHER is the source script, STUB_LIB a harmless shared object the tests copy around under
# the name libzerocta.so, BUILD_COPY the build tree's tools/zerocta-run and REAL_LIB the built
# libzerocta.so (both may be empty: build_tree then skips). Exit 0 pass, 1 fail, 77 skip.
#
# Single-quoted scripts below are expanded by the child shell, on purpose.
# shellcheck disable=SC2016
set -euo pipefail

CASE=$1
LAUNCHER=$(readlink -f -- "$2")
STUB=$3
BUILD_COPY=${4:-}
REAL_LIB=${5:-}

T=$(readlink -f -- "$(mktemp -d)")
trap 'rm -rf -- "$T"' EXIT
# The launcher's inputs come from the environment; start every case from a known one.
unset ZEROCTA_LIB LD_PRELOAD ZEROCTA_STATS ZEROCTA_LOG ZEROCTA_ALLGATHER NCCL_NVLS_ENABLE \
  TORCH_SYMM_MEM_DISABLE_MULTICAST

mkdir -p "$T/lib"
cp -- "$STUB" "$T/lib/libzerocta.so"
LIB=$T/lib/libzerocta.so
LIB_REAL=$(readlink -f -- "$LIB")

fail() {
  echo "FAIL [$CASE]: $*"
  echo "--- exit status: ${RC:-?}"
  echo "--- stdout:"
  cat -- "$T/out" 2>/dev/null || true
  echo "--- stderr:"
  cat -- "$T/err" 2>/dev/null || true
  exit 1
}

# run CMD...: runs it, keeping stdout in $T/out, stderr in $T/err and the status in RC.
run() {
  set +e
  "$@" >"$T/out" 2>"$T/err"
  RC=$?
  set -e
}

expect_rc() { [[ $RC == "$1" ]] || fail "expected exit status $1"; }

# The launcher's refusals are exactly one line on stderr, nothing on stdout.
expect_one_error_line() {
  local needle=$1
  [[ $(wc -l <"$T/err") == 1 ]] || fail "expected exactly one line on stderr"
  [[ ! -s $T/out ]] || fail "expected nothing on stdout"
  grep -qF -- "$needle" "$T/err" || fail "stderr does not mention '$needle'"
}

# Value of VAR in an `env` listing kept in $T/out; fails when it is absent.
env_value() {
  local line
  line=$(grep -m1 "^$1=" "$T/out") || fail "$1 not in the command's environment"
  printf '%s' "${line#*=}"
}

expect_env() {
  local got
  got=$(env_value "$1")
  [[ $got == "$2" ]] || fail "$1='$got', expected '$2'"
}

expect_env_absent() { ! grep -q "^$1=" "$T/out" || fail "$1 should not be set"; }

# The launcher refused, and the command it was given never ran.
expect_refused() {
  expect_rc 2
  expect_one_error_line "$1"
  [[ ! -e $T/ran ]] || fail "the command ran although the launcher refused"
}

case_missing_lib() {
  run "$LAUNCHER" --lib "$T/nope/libzerocta.so" -- touch "$T/ran"
  expect_refused "$T/nope/libzerocta.so"
  run env ZEROCTA_LIB="$T/gone.so" "$LAUNCHER" touch "$T/ran"
  expect_refused "$T/gone.so"
  # An explicit choice that is unusable is refused, not replaced by the default lookup.
  mkdir -p "$T/prefix/bin" "$T/prefix/lib"
  cp -- "$LAUNCHER" "$T/prefix/bin/zerocta-run"
  cp -- "$STUB" "$T/prefix/lib/libzerocta.so"
  run "$T/prefix/bin/zerocta-run" --lib "$T/nope.so" touch "$T/ran"
  expect_refused "$T/nope.so"
  # Not a regular file: a directory, a dangling link.
  run "$LAUNCHER" --lib "$T/lib" touch "$T/ran"
  expect_refused "$T/lib"
  ln -s "$T/nowhere.so" "$T/dangling.so"
  run "$LAUNCHER" --lib "$T/dangling.so" touch "$T/ran"
  expect_refused "$T/dangling.so"
  if [[ $(id -u) != 0 ]]; then # root reads any file
    cp -- "$STUB" "$T/unreadable.so" && chmod 000 "$T/unreadable.so"
    run "$LAUNCHER" --lib "$T/unreadable.so" touch "$T/ran"
    expect_refused "$T/unreadable.so"
  fi
  # Nothing at any default place: the line names where it looked.
  mkdir -p "$T/bare/bin"
  cp -- "$LAUNCHER" "$T/bare/bin/zerocta-run"
  run "$T/bare/bin/zerocta-run" touch "$T/ran"
  expect_refused "$T/bare/bin/../lib"
}

case_bad_values() {
  run "$LAUNCHER" --lib "$LIB" --log verbose touch "$T/ran"
  expect_refused "--log 'verbose' is not one of: none|warn|info|debug"
  run "$LAUNCHER" --lib "$LIB" --log=loud touch "$T/ran"
  expect_refused "'loud'"
  run "$LAUNCHER" --lib "$LIB" --allgather fast touch "$T/ran"
  expect_refused "--allgather 'fast' is not one of: auto|zerocta|nccl|nccl-staged|off"
  run "$LAUNCHER" --lib "$LIB" --allgather= touch "$T/ran"
  expect_refused "--allgather ''"
  run "$LAUNCHER" --lib "$LIB" --log
  expect_refused "--log needs a value"
  run "$LAUNCHER" --lib "$LIB" --frobnicate touch "$T/ran"
  expect_refused "unknown option '--frobnicate'"
  run "$LAUNCHER" -x touch "$T/ran"
  expect_refused "unknown option '-x'"
  run "$LAUNCHER" --lib "$LIB" --stats= touch "$T/ran"
  expect_refused "--stats= needs a path"
  run "$LAUNCHER" --lib "$LIB" --log info
  expect_refused "no command given"
  run "$LAUNCHER" --lib "$LIB" --
  expect_refused "no command given"
}

case_help() {
  local opt word
  for opt in --help -h; do
    # No library is needed to read the help.
    run env ZEROCTA_LIB="$T/nope.so" "$LAUNCHER" "$opt"
    expect_rc 0
    [[ ! -s $T/err ]] || fail "$opt wrote to stderr"
    for word in "usage: zerocta-run" --stats --stats=PATH %p --log --allgather --lib -- \
      NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1; do
      grep -qF -- "$word" "$T/out" || fail "$opt does not mention $word"
    done
  done
}

case_preload_order() {
  mkdir -p "$T/pre" "$T/other"
  cp -- "$STUB" "$T/pre/a.so"
  cp -- "$STUB" "$T/pre/b.so"
  cp -- "$STUB" "$T/other/libzerocta.so"
  ln -s "$LIB" "$T/pre/link-to-zerocta.so"
  local a=$T/pre/a.so b=$T/pre/b.so

  run "$LAUNCHER" --lib "$LIB" env
  expect_rc 0
  expect_env LD_PRELOAD "$LIB_REAL"

  run env LD_PRELOAD="$a:$b" "$LAUNCHER" --lib "$LIB" env
  expect_env LD_PRELOAD "$LIB_REAL:$a:$b"
  # ld.so also separates entries by spaces.
  run env LD_PRELOAD="$a $b" "$LAUNCHER" --lib "$LIB" env
  expect_env LD_PRELOAD "$LIB_REAL:$a:$b"
  # Already there: moved to the front, never twice (also when named through a link).
  run env LD_PRELOAD="$a:$LIB_REAL:$b" "$LAUNCHER" --lib "$LIB" env
  expect_env LD_PRELOAD "$LIB_REAL:$a:$b"
  run env LD_PRELOAD="$T/pre/link-to-zerocta.so:$a" "$LAUNCHER" --lib "$LIB" env
  expect_env LD_PRELOAD "$LIB_REAL:$a"
  # A launcher inside a launcher.
  run "$LAUNCHER" --lib "$LIB" "$LAUNCHER" --lib "$LIB" env
  expect_env LD_PRELOAD "$LIB_REAL"
  # Another copy of the shim would interpose a second time: replaced, with one note.
  run env LD_PRELOAD="$a:$T/other/libzerocta.so" "$LAUNCHER" --lib "$LIB" env
  expect_rc 0
  expect_env LD_PRELOAD "$LIB_REAL:$a"
  grep -qF "replacing $T/other/libzerocta.so" "$T/err" || fail "no note about the replaced copy"
  # A bare name (ld.so searches it) is kept as it is; ld.so's complaint about it goes to stderr.
  run env LD_PRELOAD="libnot-there-$$.so" "$LAUNCHER" --lib "$LIB" env
  expect_env LD_PRELOAD "$LIB_REAL:libnot-there-$$.so"
}

case_preload_reaches_children() {
  # Control: without the launcher the library is not mapped, so the check below can fail.
  run sh -c 'sh -c "cat /proc/self/maps"'
  ! grep -qF "$LIB_REAL" "$T/out" || fail "control run already maps the library"
  # A grandchild (what torchrun's ranks are) has the library mapped and sees the settings.
  run "$LAUNCHER" --lib "$LIB" --log info sh -c 'sh -c "cat /proc/self/maps"'
  expect_rc 0
  grep -qF "$LIB_REAL" "$T/out" || fail "the library is not mapped in a grandchild"
  run "$LAUNCHER" --lib "$LIB" --log info --allgather auto --stats sh -c 'sh -c env'
  expect_env ZEROCTA_LOG info
  expect_env ZEROCTA_ALLGATHER auto
  expect_env ZEROCTA_STATS 1
  expect_env NCCL_NVLS_ENABLE 0
}

case_env_exported() {
  local word
  run "$LAUNCHER" --lib "$LIB" --stats --log INFO --allgather=auto env
  expect_rc 0
  expect_env ZEROCTA_STATS 1
  expect_env ZEROCTA_LOG info
  expect_env ZEROCTA_ALLGATHER auto
  expect_env NCCL_NVLS_ENABLE 0
  expect_env TORCH_SYMM_MEM_DISABLE_MULTICAST 1

  run "$LAUNCHER" --lib "$LIB" --stats=/tmp/zc-%p.json --log=debug --allgather nccl-staged env
  expect_env ZEROCTA_STATS /tmp/zc-%p.json
  expect_env ZEROCTA_LOG debug
  expect_env ZEROCTA_ALLGATHER nccl-staged

  # Every accepted word, in any case, is exported as the library spells it.
  for word in none warn info debug; do
    run "$LAUNCHER" --lib "$LIB" --log "${word^^}" env
    expect_env ZEROCTA_LOG "$word"
  done
  for word in auto zerocta nccl nccl-staged off; do
    run "$LAUNCHER" --lib "$LIB" --allgather "$word" env
    expect_env ZEROCTA_ALLGATHER "$word"
  done

  # Options not given leave the environment alone; values already set are kept.
  run "$LAUNCHER" --lib "$LIB" env
  expect_env_absent ZEROCTA_STATS
  expect_env_absent ZEROCTA_LOG
  expect_env_absent ZEROCTA_ALLGATHER
  run env ZEROCTA_LOG=warn ZEROCTA_ALLGATHER=off NCCL_NVLS_ENABLE=1 \
    TORCH_SYMM_MEM_DISABLE_MULTICAST=0 "$LAUNCHER" --lib "$LIB" env
  expect_env ZEROCTA_LOG warn
  expect_env ZEROCTA_ALLGATHER off
  expect_env NCCL_NVLS_ENABLE 1
  expect_env TORCH_SYMM_MEM_DISABLE_MULTICAST 0
  # An option wins over the inherited value; an empty inherited value counts as unset.
  run env ZEROCTA_LOG=warn NCCL_NVLS_ENABLE= "$LAUNCHER" --lib "$LIB" --log debug env
  expect_env ZEROCTA_LOG debug
  expect_env NCCL_NVLS_ENABLE 0
}

case_exit_code() {
  run "$LAUNCHER" --lib "$LIB" sh -c 'exit 37'
  expect_rc 37
  run "$LAUNCHER" --lib "$LIB" false
  expect_rc 1
  run "$LAUNCHER" --lib "$LIB" true
  expect_rc 0
  run "$LAUNCHER" --lib "$LIB" sh -c 'kill -TERM $$'
  expect_rc 143
  run "$LAUNCHER" --lib "$LIB" "$T/no-such-command"
  expect_rc 127
  # exec: the command is the launcher's process (signals to the launcher reach it directly).
  "$LAUNCHER" --lib "$LIB" sh -c 'echo $$' >"$T/out" 2>"$T/err" &
  local pid=$!
  wait "$pid" || fail "exec check command failed"
  [[ $(cat "$T/out") == "$pid" ]] || fail "the command runs as pid $(cat "$T/out"), not $pid"
}

case_double_dash() {
  mkdir -p "$T/bin"
  printf '#!/bin/sh\necho dash-command-ran\n' >"$T/bin/-dash-cmd"
  chmod +x "$T/bin/-dash-cmd"
  run env PATH="$T/bin:$PATH" "$LAUNCHER" --lib "$LIB" -- -dash-cmd
  expect_rc 0
  grep -qx dash-command-ran "$T/out" || fail "'-- -dash-cmd' did not run the command"
  # Without '--' it is an option, and an unknown one.
  run env PATH="$T/bin:$PATH" "$LAUNCHER" --lib "$LIB" -dash-cmd
  expect_rc 2
  expect_one_error_line "unknown option '-dash-cmd'"
  # Options after '--', or after the command's name, belong to the command.
  run "$LAUNCHER" --lib "$LIB" -- sh -c 'printf "%s\n" "$@"' sh --log bogus --
  expect_rc 0
  [[ $(cat "$T/out") == $'--log\nbogus\n--' ]] || fail "the command's arguments were changed"
  run "$LAUNCHER" --lib "$LIB" sh -c 'printf "%s\n" "$@"' sh --allgather fast
  expect_rc 0
  [[ $(cat "$T/out") == $'--allgather\nfast' ]] || fail "options after the command were parsed"
  run "$LAUNCHER" --lib "$LIB" -- --log info env
  expect_rc 127 # '--log' is the command now: not found
}

case_lookup_order() {
  mkdir -p "$T/p/bin" "$T/p/lib" "$T/b/tools" "$T/s/tools" "$T/s/build" "$T/links"
  cp -- "$LAUNCHER" "$T/p/bin/zerocta-run"
  cp -- "$STUB" "$T/p/lib/libzerocta.so"
  cp -- "$STUB" "$T/p/libzerocta.so"
  cp -- "$LAUNCHER" "$T/b/tools/zerocta-run"
  cp -- "$STUB" "$T/b/libzerocta.so"
  cp -- "$STUB" "$T/b/build-decoy.so"
  cp -- "$LAUNCHER" "$T/s/tools/zerocta-run"
  cp -- "$STUB" "$T/s/build/libzerocta.so"

  # Installed (<prefix>/bin + <prefix>/lib): ../lib comes before ../
  run "$T/p/bin/zerocta-run" env
  expect_rc 0
  expect_env LD_PRELOAD "$T/p/lib/libzerocta.so"
  rm -- "$T/p/lib/libzerocta.so"
  run "$T/p/bin/zerocta-run" env
  expect_env LD_PRELOAD "$T/p/libzerocta.so"
  # Build tree (build/tools/zerocta-run + build/libzerocta.so).
  run "$T/b/tools/zerocta-run" env
  expect_env LD_PRELOAD "$T/b/libzerocta.so"
  # Source tree (tools/zerocta-run + build/libzerocta.so).
  run "$T/s/tools/zerocta-run" env
  expect_env LD_PRELOAD "$T/s/build/libzerocta.so"
  # Through a symlink to the script: the script's real place counts.
  ln -s "$T/s/tools/zerocta-run" "$T/links/zr"
  run "$T/links/zr" env
  expect_env LD_PRELOAD "$T/s/build/libzerocta.so"
  # $ZEROCTA_LIB beats the layout, --lib beats $ZEROCTA_LIB.
  run env ZEROCTA_LIB="$LIB" "$T/b/tools/zerocta-run" env
  expect_env LD_PRELOAD "$LIB_REAL"
  run env ZEROCTA_LIB="$LIB" "$T/b/tools/zerocta-run" --lib "$T/b/build-decoy.so" env
  expect_env LD_PRELOAD "$T/b/build-decoy.so"
  run env ZEROCTA_LIB="$LIB" "$T/b/tools/zerocta-run" --lib="$T/b/build-decoy.so" env
  expect_env LD_PRELOAD "$T/b/build-decoy.so"
  # A relative --lib becomes absolute (ranks may run elsewhere).
  run sh -c 'cd "$1" && "$2" --lib lib/libzerocta.so env' sh "$T" "$LAUNCHER"
  expect_env LD_PRELOAD "$LIB_REAL"
}

case_build_tree() {
  if [[ -z $BUILD_COPY || -z $REAL_LIB ]]; then
    echo "SKIP: tools not built, or a sanitized libzerocta.so (cannot be preloaded into sh)"
    exit 77
  fi
  [[ -x $BUILD_COPY ]] || fail "$BUILD_COPY is missing or not executable"
  cmp -s -- "$BUILD_COPY" "$LAUNCHER" || fail "$BUILD_COPY differs from $LAUNCHER (stale copy)"
  # The build's copy finds the build's library as ../libzerocta.so, and it loads.
  run "$BUILD_COPY" sh -c 'printf "%s\n" "$LD_PRELOAD"; grep -c libzerocta.so /proc/self/maps'
  expect_rc 0
  [[ $(sed -n 1p "$T/out") == "$(readlink -f -- "$REAL_LIB")" ]] ||
    fail "LD_PRELOAD is not $REAL_LIB"
  [[ $(sed -n 2p "$T/out") -ge 1 ]] || fail "libzerocta.so is not mapped in the command"
}

case_shellcheck() {
  if ! command -v shellcheck >/dev/null; then
    echo "SKIP: shellcheck not installed"
    exit 77
  fi
  local -a examples
  shopt -s nullglob
  examples=("$(dirname -- "$LAUNCHER")"/../LD_PRELOAD-examples/*.sh "$(dirname -- "$LAUNCHER")"/zerocta-deps)
  shopt -u nullglob
  run shellcheck -- "$LAUNCHER" "$(readlink -f -- "$0")" ${examples[@]+"${examples[@]}"}
  expect_rc 0
}

"case_$CASE"
echo "PASS [$CASE]"
