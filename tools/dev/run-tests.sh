#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run the test suites and print one closing line "N passed, N failed, N skipped".
#   tools/dev/run-tests.sh BUILD_DIR [--no-sanitize] [--nccl-h=VERSION:INCLUDE_DIR]...
# Runs the unit suite (and the gpu suite where a GPU exists), then the unit
# suite again under AddressSanitizer and UndefinedBehaviorSanitizer, then the
# bounded fuzz suite when it was built. Each --nccl-h builds the shim and its
# tests (CPU only) against that nccl.h in BUILD_DIR-nccl-VERSION and runs the
# unit suite's shim-* tests there; an empty INCLUDE_DIR (the header could not
# be had) is reported as skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
shift || true
SANITIZE=1
HEADERS=()
for a in "$@"; do
    case "$a" in
    --no-sanitize) SANITIZE=0 ;;
    --nccl-h=*) HEADERS+=("${a#--nccl-h=}") ;;
    esac
done

total_pass=0 total_fail=0 total_skip=0
status=0

count() { # build dir, label
    python3 - "$1/meson-logs/testlog.json" "$2" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    res = r.get("result")
    if res in ("OK", "EXPECTEDFAIL"):
        p += 1
    elif res == "SKIP":
        s += 1
    else:
        f += 1
        print(f"  failed: {r.get('name')} ({res}), the last lines it printed:", file=sys.stderr)
        for out in (r.get("stdout") or "").splitlines()[-40:]:
            print(f"    | {out}", file=sys.stderr)
print(p, f, s)
PY
}

run_suite() { # build dir, label, meson test args...
    local dir=$1 label=$2
    shift 2
    meson test -C "$dir" --print-errorlogs --num-processes 2 "$@" >"$dir/meson-logs/run-$label.txt" 2>&1
    local rc=$?
    grep -h "Checks:" "$dir/meson-logs/testlog.txt" | sed "s/^/  [$label] /" || true
    read -r p f s < <(count "$dir" "$label")
    echo "$label: $p passed, $f failed, $s skipped"
    total_pass=$((total_pass + p)) total_fail=$((total_fail + f)) total_skip=$((total_skip + s))
    if [ $rc -ne 0 ]; then
        tail -n 20 "$dir/meson-logs/run-$label.txt"
        status=1
    fi
}

run_suite "$BUILD" unit --suite unit
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then
    run_suite "$BUILD" gpu --suite gpu
fi

if [ $SANITIZE = 1 ]; then
    SAN="$BUILD-asan"
    if [ ! -f "$SAN/build.ninja" ]; then
        meson setup "$SAN" -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled >/dev/null
    fi
    if ninja -C "$SAN" >"$BUILD/meson-logs/asan-build.txt" 2>&1; then
        ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:verify_asan_link_order=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
            run_suite "$SAN" unit-asan --suite unit
    else
        tail -n 40 "$BUILD/meson-logs/asan-build.txt"
        echo "unit-asan: build failed"
        total_fail=$((total_fail + 1))
        status=1
    fi
fi

# The unit suite's shim-* tests of a configured build dir, then the targets
# they run or depend on (paths relative to the build dir), one a line each.
shim_tests() { # build dir
    meson introspect "$1" --tests --targets | python3 -c '
import json, os, sys
info = json.load(sys.stdin)
root = os.path.abspath(sys.argv[1])
tests = [t for t in info["tests"] if t["name"].startswith("shim-") and any(s.endswith(":unit") for s in t["suite"])]
by_id = {t["id"]: t["filename"] for t in info["targets"]}
outputs = {f for fs in by_id.values() for f in fs}
want = set()
for t in tests:
    want.update(f for d in t["depends"] for f in by_id.get(d, []))
    words = t["cmd"] + list(t["env"].values())
    want.update(w for w in words if w in outputs)
print(" ".join(t["name"] for t in tests))
print(" ".join(sorted(os.path.relpath(f, root) for f in want)))
' "$1"
}

run_header() { # NCCL version, directory of its nccl.h (empty: none could be had)
    local v=$1 inc=$2 dir="$BUILD-nccl-$1" label="nccl-$1" t0 t1 names targets
    if [ -z "$inc" ]; then
        echo "$label: skipped (no nccl.h $v could be downloaded; see the fetch-nccl-h line above)"
        total_skip=$((total_skip + 1))
        return
    fi
    t0=$(date +%s)
    if [ -f "$dir/build.ninja" ]; then
        meson configure "$dir" -Dnccl_include="$inc" >/dev/null
    else
        meson setup "$dir" -Dcuda=disabled -Dfuzz=disabled -Dnccl_include="$inc" >/dev/null
    fi
    { read -r names; read -r targets; } < <(shim_tests "$dir")
    # shellcheck disable=SC2086
    if ! ninja -C "$dir" $targets >"$dir/meson-logs/shim-build.txt" 2>&1; then
        tail -n 40 "$dir/meson-logs/shim-build.txt"
        echo "$label: build against $inc/nccl.h failed"
        total_fail=$((total_fail + 1))
        status=1
        return
    fi
    t1=$(date +%s)
    # shellcheck disable=SC2086
    run_suite "$dir" "$label" --suite unit --no-rebuild $names
    echo "$label: $(grep -h '^ok: .* exports equal' "$dir/meson-logs/testlog.txt" | head -n 1)"
    echo "$label: built in $((t1 - t0)) s, tested in $(($(date +%s) - t1)) s"
}

for h in "${HEADERS[@]}"; do
    run_header "${h%%:*}" "${h#*:}"
done

if meson test -C "$BUILD" --list 2>/dev/null | grep -q ':fuzz'; then
    run_suite "$BUILD" fuzz --suite fuzz
fi

echo "$total_pass passed, $total_fail failed, $total_skip skipped"
exit $status
