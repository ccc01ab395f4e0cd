#!/bin/sh
# SPDX-License-Identifier: MIT
# Run the plan-loader fuzzer for a bounded time with the MSCCL++ fixtures and
# the broken-plan corpus as seeds: run-fuzz.sh FUZZER SOURCE_ROOT REF_DIR [SECONDS]
set -eu
fuzzer=$1 src=$2 ref=$3 secs=${4:-60}
# meson passes the target relative to the build directory; the run happens elsewhere
fuzzer=$(cd "$(dirname "$fuzzer")" && pwd)/$(basename "$fuzzer")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus"
cp "$ref"/mscclpp-op-plans/*.json "$ref"/mscclpp-algo-plans/*.json "$src"/tests/data/bad-plans/*.json "$work/corpus/"
cd "$work"
exec "$fuzzer" -max_total_time="$secs" -max_len=131072 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 corpus
