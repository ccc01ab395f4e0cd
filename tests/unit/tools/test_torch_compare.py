#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Unit test of the comparer in tests/multigpu/torch_job.py on synthetic rank
dumps (no torch needed). Prints 'N passed, M failed'; exit 1 on failure."""
import array
import io
import json
import os
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "multigpu"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "common"))
import pycheck  # noqa: E402
import torch_job as tj  # noqa: E402


def f32(vals):
    return array.array("f", vals).tobytes()


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def write_run(d, world, tensors, losses, summary=None):
    """tensors: {name: (exact, same_on_ranks, [float32 bytes per rank])}, written by the job's own Recorder."""
    os.makedirs(d)
    for r in range(world):
        rec = tj.Recorder(d, r)
        for name, (exact, same, per_rank) in tensors.items():
            rec.put_raw(name, per_rank[r], "float32", [len(per_rank[r]) // 4], exact, same)
        rec.losses = [bits(x) for x in losses[r]]
        rec.close(world, {})
    if summary is not None:
        for r, s in enumerate(summary):
            with open(os.path.join(d, "sum.json.%d" % r), "w") as fh:
                json.dump([{"rank": r, "routed": s, "fallback": {"size": 1}}], fh)


BASE = {"ag": (True, True, [f32([1, 2, 3, 4])] * 2),
        "ar": (False, True, [f32([1.0, 2.0, 3.0])] * 2),
        "rs": (True, False, [f32([5]), f32([6])])}
LOSSES = [[2.5, 2.0, 1.5], [2.6, 2.1, 1.4]]

test = pycheck.Tests()


def run_cmp(t, new_tensors, new_losses=LOSSES, summary=(3, 4), require_routed=True):
    write_run(os.path.join(t, "a"), 2, BASE, LOSSES)
    write_run(os.path.join(t, "b"), 2, new_tensors, new_losses, summary)
    return tj.compare(os.path.join(t, "a"), os.path.join(t, "b"), os.path.join(t, "b", "sum.json"),
                      require_routed, 1e-4, out=io.StringIO())


@test
def identical_runs_pass():
    with tempfile.TemporaryDirectory() as t:
        assert run_cmp(t, BASE) == []


@test
def float_reduction_within_tolerance_passes():
    with tempfile.TemporaryDirectory() as t:
        n = dict(BASE, ar=(False, True, [f32([1.0, 2.0, 3.00001])] * 2))
        assert run_cmp(t, n) == []


@test
def float_reduction_out_of_tolerance_fails():
    with tempfile.TemporaryDirectory() as t:
        n = dict(BASE, ar=(False, True, [f32([1.0, 2.0, 3.1])] * 2))
        p = run_cmp(t, n)
        assert any("ar rank" in x and "differs" in x for x in p), p


@test
def exact_case_one_bit_off_fails():
    with tempfile.TemporaryDirectory() as t:
        n = dict(BASE, rs=(True, False, [f32([5]), f32([6.0000005])]))
        p = run_cmp(t, n)
        assert p == ["rs rank 1: not bit-identical to NCCL (exact case)"], p


@test
def ranks_disagreeing_fails_even_within_tolerance():
    with tempfile.TemporaryDirectory() as t:
        n = dict(BASE, ar=(False, True, [f32([1.0, 2.0, 3.0]), f32([1.0, 2.0, 3.0000002])]))
        p = run_cmp(t, n)
        assert any("ranks hold different bytes" in x and "mscx run" in x for x in p), p


@test
def losses_checked_step_by_step():
    with tempfile.TemporaryDirectory() as t:
        bad = [[2.5, 2.0, 1.5], [2.6, 2.2, 1.4]]
        p = run_cmp(t, BASE, new_losses=bad)
        assert p == ["rank 1: DDP loss differs from step 1: 2.0999999046325684 vs 2.200000047683716"], p
    with tempfile.TemporaryDirectory() as t:
        short = [[2.5, 2.0], [2.6, 2.1]]
        p = run_cmp(t, BASE, new_losses=short)
        assert len(p) == 2 and all("DDP steps" in x for x in p), p


@test
def summary_must_show_routed_calls():
    with tempfile.TemporaryDirectory() as t:
        p = run_cmp(t, BASE, summary=(0, 0))
        assert any("no routed call" in x for x in p), p
    with tempfile.TemporaryDirectory() as t:
        p = run_cmp(t, BASE, summary=None)
        assert any("no routed call" in x for x in p), p
    files, routed, fb = None, None, None
    with tempfile.TemporaryDirectory() as t:
        run_cmp(t, BASE, summary=(3, 4))
        files, routed, fb = tj.read_summary(os.path.join(t, "b", "sum.json"))
    assert len(files) == 2 and routed == 7 and fb == 2


@test
def missing_rank_is_an_error():
    with tempfile.TemporaryDirectory() as t:
        write_run(os.path.join(t, "a"), 2, BASE, LOSSES)
        write_run(os.path.join(t, "b"), 2, BASE, LOSSES)
        os.unlink(os.path.join(t, "b", "rank1.json"))
        p = tj.compare(os.path.join(t, "a"), os.path.join(t, "b"), out=io.StringIO())
        assert len(p) == 1 and "cannot load" in p[0], p


@test
def decode_half_and_bf16():
    assert tj.decode(struct.pack("<e", 1.5), "float16") == [1.5]
    assert tj.decode(struct.pack("<H", 0x3fc0), "bfloat16") == [1.5]


if __name__ == "__main__":
    sys.exit(test.main())
