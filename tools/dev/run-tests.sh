#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run the test suites and print one closing line "N passed, N failed, N skipped".
#   tools/dev/run-tests.sh BUILD_DIR [--no-sanitize]
# Runs the unit suite (and the gpu suite where a GPU exists), then the unit
# suite again under AddressSanitizer and UndefinedBehaviorSanitizer, then the
# bounded fuzz suite when it was built.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
shift || true
SANITIZE=1
for a in "$@"; do
    case "$a" in
    --no-sanitize) SANITIZE=0 ;;
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
        print(f"  failed: {r.get('name')} ({res})", file=sys.stderr)
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
        tail -n 60 "$dir/meson-logs/run-$label.txt"
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

if meson test -C "$BUILD" --list 2>/dev/null | grep -q ':fuzz'; then
    run_suite "$BUILD" fuzz --suite fuzz
fi

echo "$total_pass passed, $total_fail failed, $total_skip skipped"
exit $status
