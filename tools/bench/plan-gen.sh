# SPDX-License-Identifier: MIT
# Sourced by tests/unit/tools/bench-{select,variants,blocks}.sh: moves to the
# repository root and sets BUILD (default bd) and RESULTS (default out);
# plan_dir NAME makes RESULTS/NAME the folder V of the plans a script generates,
# and gen NAME ARGS... writes plan NAME there with BUILD's mscx-plangen
# (--coll allreduce, then ARGS), exiting on the first failure.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
BUILD=${BUILD:-bd}
RESULTS=${RESULTS:-out}
plan_dir() {
    V=$RESULTS/$1
    mkdir -p "$V"
}
gen() { # name, then mscx-plangen arguments
    local name=$1
    shift
    "$BUILD/tools/mscx-plangen" --coll allreduce "$@" --name "$name" -o "$V/$name.json" --quiet || exit 1
}
