#!/usr/bin/env bash
# Tests of tools/zerocta-run, one CTest per case:
#   test_zerocta_run.sh CASE LAUNCHER STUB_LIB [BUILD_COPY] [REAL_LIB] [DEMO]
# LAUNCHER is the source script, STUB_LIB a harmless shared object the tests copy around under
# the name libzerocta.so, BUILD_COPY the build tree's tools/zerocta-run, REAL_LIB the built
# libzerocta.so (both may be empty: build_tree then skips) and DEMO the built zerocta-demo (may
# be empty: demo_gpu_count skips). Exit 0 pass, 1 fail, 77 skip.
#
# Single-quoted scripts below are expanded by the child shell, on purpose.
# shellcheck disable=SC2016
set -euo pipefail

CASE=$1
LAUNCHER=$(readlink -f -- "$2")
STUB=$3
BUILD_COPY=${4:-}
REAL_LIB=${5:-}
DEMO=${6:-}

T=$(readlink -f -- "$(mktemp -d)")
trap 'rm -rf -- "$T"' EXIT
# The launcher's inputs come from the environment; start every case from a known one.
unset LD_PRELOAD NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST PYTORCH_CUDA_ALLOC_CONF \
  PYTORCH_ALLOC_CONF
while IFS= read -r var; do unset "$var"; done < <(compgen -e ZEROCTA_)

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

# stderr of a --dry-run with the stub, which has no zerocta_check_config: one line saying that
# the values could not be checked ($1 the library's real path), then what is left in $T/rest.
expect_cannot_check() {
  local note="zerocta-run: cannot check the ZEROCTA_* values with $1: "
  [[ $(head -n1 "$T/err") == "$note"*zerocta_check_config* ]] ||
    fail "the first line on stderr does not say that $1 cannot be checked"
  tail -n +2 "$T/err" >"$T/rest"
}

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
  expect_refused "--allgather 'fast' is not one of: auto|zerocta|nccl|off"
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
    for word in "usage: zerocta-run" --stats --stats=PATH %p %r %h --log --allgather --lib \
      --dry-run --check --no-alloc-conf --version -- "NCCL_* and TORCH_* variables are yours"; do
      grep -qF -- "$word" "$T/out" || fail "$opt does not mention $word"
    done
    ! grep -qE "NCCL_NVLS_ENABLE|TORCH_SYMM_MEM" "$T/out" || fail "$opt still mentions multicast"
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
  expect_env_absent NCCL_NVLS_ENABLE
}

case_env_exported() {
  local word
  run "$LAUNCHER" --lib "$LIB" --stats --log INFO --allgather=auto env
  expect_rc 0
  expect_env ZEROCTA_STATS 1
  expect_env ZEROCTA_LOG info
  expect_env ZEROCTA_ALLGATHER auto

  run "$LAUNCHER" --lib "$LIB" --stats=/tmp/zc-%p.json --log=debug --allgather zerocta env
  expect_env ZEROCTA_STATS /tmp/zc-%p.json
  expect_env ZEROCTA_LOG debug
  expect_env ZEROCTA_ALLGATHER zerocta

  # Every accepted word, in any case, is exported as the library spells it.
  for word in none warn info debug; do
    run "$LAUNCHER" --lib "$LIB" --log "${word^^}" env
    expect_env ZEROCTA_LOG "$word"
  done
  for word in auto zerocta nccl off; do
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
  # An option wins over the inherited value, and the summary line says what it replaced.
  run env ZEROCTA_LOG=warn NCCL_NVLS_ENABLE= "$LAUNCHER" --lib "$LIB" --log debug env
  expect_env ZEROCTA_LOG debug
  expect_env NCCL_NVLS_ENABLE ""
  grep -qF "ZEROCTA_LOG=debug (replacing warn from the environment)" "$T/err" ||
    fail "the summary does not say that ZEROCTA_LOG=warn was replaced"
}

# The launcher sets LD_PRELOAD and the ZEROCTA_* variables of its options, nothing else: the
# environment of the command is the caller's plus exactly those.
case_sets_nothing_else() {
  run env -i PATH="$PATH" HOME=/nowhere "$LAUNCHER" --lib "$LIB" env
  expect_rc 0
  [[ $(grep -cv -e '^PATH=' -e '^HOME=' -e '^LD_PRELOAD=' -e '^_=' -e '^PWD=' -e '^SHLVL=' \
    "$T/out") == 0 ]] || fail "the launcher set variables nobody asked for"
  run env -i PATH="$PATH" "$LAUNCHER" --lib "$LIB" --allgather auto --stats --log info env
  expect_rc 0
  local extra
  extra=$(grep -v -e '^PATH=' -e '^LD_PRELOAD=' -e '^_=' -e '^PWD=' -e '^SHLVL=' "$T/out" | sort |
    tr '\n' ' ')
  [[ $extra == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ZEROCTA_ALLGATHER=auto ZEROCTA_LOG=info ZEROCTA_STATS=1 " ]] ||
    fail "unexpected environment: $extra"
  for var in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST; do
    expect_env_absent "$var"
  done
  # Values the user set are passed on untouched, whatever they are.
  run env NCCL_NVLS_ENABLE=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=0 NCCL_DEBUG=INFO \
    "$LAUNCHER" --lib "$LIB" --allgather auto env
  expect_env NCCL_NVLS_ENABLE 1
  expect_env TORCH_SYMM_MEM_DISABLE_MULTICAST 0
  expect_env NCCL_DEBUG INFO
}

# One line on stderr says what was set, before the command runs; nothing on stdout.
case_summary_line() {
  mkdir -p "$T/pre"
  cp -- "$STUB" "$T/pre/libjemalloc.so"
  run env LD_PRELOAD="$T/pre/libjemalloc.so" "$LAUNCHER" --lib "$LIB" --allgather auto \
    --stats=/tmp/zc-%r.json true
  expect_rc 0
  [[ ! -s $T/out ]] || fail "the launcher wrote to stdout"
  [[ $(wc -l <"$T/err") == 1 ]] || fail "expected exactly one line on stderr"
  [[ $(cat "$T/err") == "zerocta-run: set LD_PRELOAD=$LIB_REAL:$T/pre/libjemalloc.so ZEROCTA_ALLGATHER=auto PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ZEROCTA_STATS=/tmp/zc-%r.json" ]] ||
    fail "unexpected summary line"
  # A value that needs quoting is shown quoted, still on one line.
  run "$LAUNCHER" --lib "$LIB" --stats="/tmp/a b/zc.json" true
  expect_rc 0
  [[ $(wc -l <"$T/err") == 1 ]] || fail "expected exactly one line on stderr"
  grep -qF 'ZEROCTA_STATS=/tmp/a\ b/zc.json' "$T/err" || fail "the value is not quoted"
}

case_dry_run() {
  mkdir -p "$T/pre"
  cp -- "$STUB" "$T/pre/libtcmalloc.so"
  # No command needed; NAME=value lines on stdout; the command, if given, does not run.
  run env LD_PRELOAD="$T/pre/libtcmalloc.so" "$LAUNCHER" --lib "$LIB" --allgather=auto --log \
    info --dry-run
  expect_rc 0
  [[ $(cat "$T/out") == "LD_PRELOAD=$LIB_REAL:$T/pre/libtcmalloc.so"$'\n'"ZEROCTA_ALLGATHER=auto"$'\n'"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"$'\n'"ZEROCTA_LOG=info" ]] ||
    fail "unexpected --dry-run output"
  expect_cannot_check "$LIB_REAL"
  [[ ! -s $T/rest ]] || fail "--dry-run wrote to stderr without a reason"
  run "$LAUNCHER" --lib "$LIB" --dry-run touch "$T/ran"
  expect_rc 0
  [[ ! -e $T/ran ]] || fail "--dry-run ran the command"
  [[ $(cat "$T/out") == "LD_PRELOAD=$LIB_REAL" ]] || fail "unexpected --dry-run output"
  # Its output can be sourced: values are shell-quoted.
  run "$LAUNCHER" --lib "$LIB" --stats='/tmp/x y/%r.json' --dry-run
  expect_rc 0
  cp -- "$T/out" "$T/dry.env"
  run bash -c 'eval "$(cat "$1")"; printf "%s\n" "$ZEROCTA_STATS"' sh "$T/dry.env"
  [[ $(cat "$T/out") == "/tmp/x y/%r.json" ]] || fail "--dry-run output does not source back"
  # Inherited ZEROCTA_* values are shown too, as comments after what it sets.
  run env ZEROCTA_MIN_BYTES=2G ZEROCTA_ALLGATHER=nccl "$LAUNCHER" --lib "$LIB" \
    --allgather auto --dry-run
  expect_rc 0
  [[ $(cat "$T/out") == "LD_PRELOAD=$LIB_REAL"$'\n'"ZEROCTA_ALLGATHER=auto"$'\n'"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"$'\n'"# inherited: ZEROCTA_MIN_BYTES=2G" ]] ||
    fail "--dry-run does not show the inherited ZEROCTA_MIN_BYTES: $(cat "$T/out")"
  # Refusals are the same as without --dry-run.
  run "$LAUNCHER" --lib "$T/nope.so" --dry-run
  expect_refused "$T/nope.so"
  run "$LAUNCHER" --lib "$LIB" --log loud --dry-run
  expect_refused "'loud'"
}

# --allgather auto|zerocta turns on PyTorch's expandable segments, and only then: not with
# nccl/off, not when the job set either allocator variable, not with --no-alloc-conf.
case_alloc_conf() {
  local word
  for word in auto zerocta; do
    run "$LAUNCHER" --lib "$LIB" --allgather "$word" env
    expect_rc 0
    expect_env PYTORCH_CUDA_ALLOC_CONF expandable_segments:True
    expect_env_absent PYTORCH_ALLOC_CONF
    grep -qF "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" "$T/err" ||
      fail "the summary line does not say it set PYTORCH_CUDA_ALLOC_CONF"
  done
  for word in nccl off; do
    run "$LAUNCHER" --lib "$LIB" --allgather "$word" env
    expect_env_absent PYTORCH_CUDA_ALLOC_CONF
  done
  run "$LAUNCHER" --lib "$LIB" env
  expect_env_absent PYTORCH_CUDA_ALLOC_CONF
  run "$LAUNCHER" --lib "$LIB" --allgather auto --no-alloc-conf env
  expect_env_absent PYTORCH_CUDA_ALLOC_CONF
  run env PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 "$LAUNCHER" --lib "$LIB" --allgather auto env
  expect_env PYTORCH_CUDA_ALLOC_CONF max_split_size_mb:128
  run env PYTORCH_ALLOC_CONF=garbage_collection_threshold:0.6 "$LAUNCHER" --lib "$LIB" \
    --allgather auto env
  expect_env PYTORCH_ALLOC_CONF garbage_collection_threshold:0.6
  expect_env_absent PYTORCH_CUDA_ALLOC_CONF
  # An empty value is a choice too.
  run env PYTORCH_CUDA_ALLOC_CONF= "$LAUNCHER" --lib "$LIB" --allgather auto env
  expect_env PYTORCH_CUDA_ALLOC_CONF ""
}

# --reducescatter sets the reduce-scatter's route alone (any memory works: no allocator
# setting); --ce sets every copy-engine route at once, with the all-gather's allocator setting.
case_route_options() {
  local word
  for word in auto zerocta nccl off; do
    run "$LAUNCHER" --lib "$LIB" --reducescatter "${word^^}" env
    expect_rc 0
    expect_env ZEROCTA_REDUCESCATTER "$word"
    expect_env_absent ZEROCTA_ALLGATHER
    expect_env_absent PYTORCH_CUDA_ALLOC_CONF
  done
  run "$LAUNCHER" --lib "$LIB" --ce=auto env
  expect_rc 0
  expect_env ZEROCTA_ALLGATHER auto
  expect_env ZEROCTA_REDUCESCATTER auto
  expect_env PYTORCH_CUDA_ALLOC_CONF expandable_segments:True
  # A per-route option after --ce wins for its route.
  run "$LAUNCHER" --lib "$LIB" --ce zerocta --reducescatter nccl env
  expect_env ZEROCTA_ALLGATHER zerocta
  expect_env ZEROCTA_REDUCESCATTER nccl
  run "$LAUNCHER" --lib "$LIB" --ce fast env
  expect_refused "--ce 'fast' is not one of: auto|zerocta|nccl|off"
  run "$LAUNCHER" --lib "$LIB" --reducescatter= env
  expect_refused "--reducescatter ''"
}

case_version() {
  local want
  want=$(sed -n 's/^project(zerocta VERSION \([0-9.]*\).*/\1/p' "$(dirname -- "$LAUNCHER")/../CMakeLists.txt")
  [[ -n $want ]] || fail "no project version in CMakeLists.txt"
  # The script's own version is the project's.
  grep -qx "readonly VERSION=$want" "$LAUNCHER" || fail "the script's VERSION is not $want"
  # A library with the version written in it (as src/interpose/zerocta_api.cc writes it).
  cp -- "$STUB" "$T/tagged.so"
  printf '\0@(#)zerocta 9.8.7\0' >>"$T/tagged.so"
  run "$LAUNCHER" --lib "$T/tagged.so" --version
  expect_rc 0
  [[ $(cat "$T/out") == "zerocta 9.8.7 ($T/tagged.so)" ]] || fail "not the library's version"
  run env ZEROCTA_LIB="$T/tagged.so" "$LAUNCHER" --version
  [[ $(cat "$T/out") == "zerocta 9.8.7 ($T/tagged.so)" ]] || fail "ZEROCTA_LIB not used"
  # Without a version in the library, or without a library: the script's, and why.
  run "$LAUNCHER" --lib "$LIB" --version
  expect_rc 0
  [[ $(cat "$T/out") == "zerocta $want (zerocta-run; $LIB_REAL carries no version)" ]] ||
    fail "unexpected --version output for a library without a version"
  run "$LAUNCHER" --lib "$T/nope.so" --version
  expect_rc 0
  [[ $(cat "$T/out") == "zerocta $want (zerocta-run; libzerocta.so not found)" ]] ||
    fail "unexpected --version output without a library"
  [[ ! -s $T/err ]] || fail "--version wrote to stderr"
  # The built library carries the project's version.
  if [[ -n $REAL_LIB ]]; then
    run "$LAUNCHER" --lib "$REAL_LIB" --version
    [[ $(cat "$T/out") == "zerocta $want ($(readlink -f -- "$REAL_LIB"))" ]] ||
      fail "the built library does not carry version $want"
  fi
}

# Misspelt ZEROCTA_* variables: one warning each, in the library's words, before the command
# runs and in --dry-run; known names (the library's and the tools') are not reported.
case_unknown_vars() {
  run env ZEROCTA_ALLGATHR=auto "$LAUNCHER" --lib "$LIB" true
  expect_rc 0
  [[ $(sed -n 1p "$T/err") == "zerocta-run: warning: ZEROCTA_ALLGATHR is not a zerocta variable and is ignored; did you mean ZEROCTA_ALLGATHER?" ]] ||
    fail "no warning for ZEROCTA_ALLGATHR"
  [[ $(wc -l <"$T/err") == 2 ]] || fail "expected the warning and the summary line"
  run env ZEROCTA_ALLGATHR=auto "$LAUNCHER" --lib "$LIB" --dry-run
  expect_rc 0
  grep -qF "did you mean ZEROCTA_ALLGATHER?" "$T/err" || fail "no warning in --dry-run"
  # The same nearest names as the library's unit tests (tests/unit/config_test.cc).
  run env ZEROCTA_LOGG=1 ZEROCTA_MINBYTES=1 ZEROCTA_CHANEL_DIR=1 ZEROCTA_allgather=1 \
    ZEROCTA_CTA_POLICY_FORCED=1 ZEROCTA_SOMETHING_ELSE_ENTIRELY=1 "$LAUNCHER" --lib "$LIB" \
    --dry-run
  local pair
  for pair in ZEROCTA_LOGG:ZEROCTA_LOG ZEROCTA_MINBYTES:ZEROCTA_MIN_BYTES \
    ZEROCTA_CHANEL_DIR:ZEROCTA_CHANNEL_DIR ZEROCTA_allgather:ZEROCTA_ALLGATHER \
    ZEROCTA_CTA_POLICY_FORCED:ZEROCTA_CTA_POLICY_FORCE; do
    grep -qxF "zerocta-run: warning: ${pair%%:*} is not a zerocta variable and is ignored; did you mean ${pair#*:}?" "$T/err" ||
      fail "no suggestion of ${pair#*:} for ${pair%%:*}"
  done
  grep -qE "^zerocta-run: warning: ZEROCTA_SOMETHING_ELSE_ENTIRELY is not a zerocta variable and is ignored \(the nearest zerocta variable is ZEROCTA_[A-Z_]+\)$" \
    "$T/err" || fail "no plain warning for a far name"
  # (The stub cannot check the values itself: the launcher names unknown variables instead.)
  expect_cannot_check "$LIB_REAL"
  [[ $(wc -l <"$T/rest") == 6 ]] || fail "expected one warning per unknown name"
  # Known names: silent (ZEROCTA_LIB is the launcher's own, ZEROCTA_BUILD an example script's).
  run env ZEROCTA_LIB="$LIB" ZEROCTA_LOG=info ZEROCTA_MIN_BYTES=1M ZEROCTA_NCCL_LIBRARY=/x \
    ZEROCTA_BUILD=/x "$LAUNCHER" --dry-run
  expect_rc 0
  expect_cannot_check "$LIB_REAL"
  [[ ! -s $T/rest ]] || fail "a known name was reported"
  # Unexported shell variables are nobody's business.
  run bash -c 'ZEROCTA_TYPO=1; "$1" --lib "$2" --dry-run' sh "$LAUNCHER" "$LIB"
  expect_cannot_check "$LIB_REAL"
  [[ ! -s $T/rest ]] || fail "an unexported shell variable was reported"
}

# --check and --dry-run have the built library judge the values, with its own parser, in a
# process without NCCL or a GPU (python3 loads it).
case_check() {
  if [[ -z $REAL_LIB ]]; then
    echo "SKIP: a sanitized libzerocta.so (cannot be loaded into python3)"
    exit 77
  fi
  if ! command -v python3 >/dev/null; then
    echo "SKIP: python3 not installed"
    exit 77
  fi
  local real
  real=$(readlink -f -- "$REAL_LIB")
  # A bogus value: status 1, the library's WARN naming it, then its configuration line.
  run env ZEROCTA_ALLGATHER=bogus "$LAUNCHER" --lib "$REAL_LIB" --check touch "$T/ran"
  expect_rc 1
  [[ ! -e $T/ran ]] || fail "--check ran the command"
  [[ $(wc -l <"$T/out") == 2 ]] || fail "expected the WARN and the configuration line"
  grep -qE '^[^ ]+ \[-1\] zerocta WARN ZEROCTA_ALLGATHER="bogus" is invalid \(accepted: auto\|zerocta\|nccl\|off\); using the default "nccl"$' \
    "$T/out" || fail "no WARN naming ZEROCTA_ALLGATHER=bogus"
  grep -qF " zerocta INFO config: zerocta " "$T/out" || fail "no configuration line"
  [[ ! -s $T/err ]] || fail "--check wrote to stderr"
  # An unknown name only warns.
  run env ZEROCTA_FOO=1 "$LAUNCHER" --lib "$REAL_LIB" --check
  expect_rc 0
  grep -qF " zerocta WARN ZEROCTA_FOO is not a zerocta variable and is ignored" "$T/out" ||
    fail "no WARN naming ZEROCTA_FOO"
  # A good configuration, options included, whatever ZEROCTA_LOG says: exit 0, one line.
  run env ZEROCTA_MIN_BYTES=1M ZEROCTA_LOG=none "$LAUNCHER" --lib "$REAL_LIB" --allgather auto \
    --check
  expect_rc 0
  [[ $(wc -l <"$T/out") == 1 ]] || fail "expected the configuration line alone"
  grep -qF " zerocta INFO config: zerocta " "$T/out" || fail "no configuration line"
  local field
  for field in "ZEROCTA_ENABLE=1" "ZEROCTA_LOG=none" "ZEROCTA_ALLGATHER=auto" \
    "ZEROCTA_MIN_BYTES=1048576" "fingerprint="; do
    grep -qF " $field" "$T/out" || fail "the configuration line lacks $field"
  done
  [[ ! -s $T/err ]] || fail "--check wrote to stderr"
  # --dry-run checks too: the listing on stdout, the library's lines on stderr, status 1.
  run env ZEROCTA_ALLGATHER=bogus "$LAUNCHER" --lib "$REAL_LIB" --dry-run
  expect_rc 1
  [[ $(cat "$T/out") == "LD_PRELOAD=$real"$'\n'"# inherited: ZEROCTA_ALLGATHER=bogus" ]] ||
    fail "unexpected --dry-run output"
  grep -qF ' zerocta WARN ZEROCTA_ALLGATHER="bogus" is invalid' "$T/err" ||
    fail "--dry-run does not name the bogus value"
  # ... whose unknown-name warnings replace the launcher's own.
  run env ZEROCTA_ALLGATHR=auto "$LAUNCHER" --lib "$REAL_LIB" --dry-run
  expect_rc 0
  grep -qF " zerocta WARN ZEROCTA_ALLGATHR is not a zerocta variable" "$T/err" ||
    fail "--dry-run does not name the misspelt variable"
  ! grep -qF "zerocta-run: warning:" "$T/err" || fail "the misspelt variable is reported twice"
  # A library without the check: --check cannot answer (status 2, one line).
  run "$LAUNCHER" --lib "$LIB" --check
  expect_rc 2
  [[ $(wc -l <"$T/err") == 1 ]] || fail "expected one line on stderr"
  expect_cannot_check "$LIB_REAL"
  [[ ! -s $T/out ]] || fail "--check wrote to stdout without a library to check"
}

# tools/zerocta-deps --help prints its header comment only.
case_deps_help() {
  local deps
  deps=$(dirname -- "$LAUNCHER")/zerocta-deps
  run "$deps" --help
  expect_rc 0
  grep -qF -- "--check" "$T/out" || fail "zerocta-deps --help does not mention --check"
  grep -qF "zerocta-deps: installs" "$T/out" || fail "zerocta-deps --help lacks its first line"
  ! grep -qE "set -euo|^#" "$T/out" || fail "zerocta-deps --help prints its code or comment marks"
}

# zerocta-demo counts the GPUs the CUDA runtime sees (CUDA_VISIBLE_DEVICES respected).
case_demo_gpu_count() {
  if [[ -z $DEMO ]]; then
    echo "SKIP: zerocta-demo not built"
    exit 77
  fi
  run env CUDA_VISIBLE_DEVICES= "$DEMO"
  expect_rc 0
  grep -qF "0 GPU(s) found" "$T/out" || fail "CUDA_VISIBLE_DEVICES= must hide every GPU"
  run env CUDA_VISIBLE_DEVICES=0 "$DEMO"
  expect_rc 0
  grep -qE "[01] GPU\(s\) found" "$T/out" || fail "CUDA_VISIBLE_DEVICES=0 shows at most 1 GPU"
  # The demo does not change NCCL's settings: its ranks see the caller's environment.
  ! grep -qa "NCCL_NVLS_ENABLE" "$DEMO" || fail "zerocta-demo still sets NCCL_NVLS_ENABLE"
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
  examples=("$(dirname -- "$LAUNCHER")"/../LD_PRELOAD-examples/*.sh "$(dirname -- "$LAUNCHER")"/zerocta-deps
    "$(dirname -- "$LAUNCHER")"/../tests/install/*.sh)
  shopt -u nullglob
  run shellcheck -- "$LAUNCHER" "$(readlink -f -- "$0")" ${examples[@]+"${examples[@]}"}
  expect_rc 0
}

"case_$CASE"
echo "PASS [$CASE]"
