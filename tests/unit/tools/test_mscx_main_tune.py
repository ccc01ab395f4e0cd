#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/ab/mscx-main BUILD --gpu with the tuner, dry: a copy of the script in a
temporary tree whose tools/tune/mscx-tune and tools/ab/mscx-ab are fakes that
log their arguments, and a fake nvidia-smi. It checks what the job runs: on one
GPU the tuner at world size 1 and with --executor 2, 4, 8 within the total
budget, then the A/B against NCCL on the tuned plans; on two GPUs the tuner
with --nproc 2; a failing tuner (the A/B then uses the shipped plans), --no-tune,
a bad --tune-budget; and shellcheck, where it is installed.

usage: test_mscx_main_tune.py MSCX_MAIN
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
import pycheck  # noqa: E402

# Logs {"tool", "args"} to FAKE_LOG; writes OUT/report.md and OUT/plans/ (mscx-tune) or prints a table
# (mscx-ab). FAKE_TUNE_FAIL=WORD fails the tuner runs whose --out contains WORD.
FAKE = r'''#!/usr/bin/env python3
import json, os, sys
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as fh:
    fh.write(json.dumps({"tool": tool, "args": args}) + "\n")
def opt(k):
    return args[args.index(k) + 1] if k in args else None
if tool == "mscx-tune":
    out = opt("--out")
    if os.environ.get("FAKE_TUNE_FAIL") and os.environ["FAKE_TUNE_FAIL"] in out:
        print("mscx-tune: FAILED: fake", file=sys.stderr)
        sys.exit(1)
    os.makedirs(os.path.join(out, "plans"), exist_ok=True)
    open(os.path.join(out, "plans", "tune_fake.json"), "w").write("{}")
    open(os.path.join(out, "report.md"), "w").write("# fake tuner report %s\n" % os.path.basename(out))
else:
    out = opt("--out")
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "ab.png"), "w").close()
    print("| size | fake ab table %s |" % os.path.basename(out))
'''

SMI = ("#!/bin/sh\ni=0\nwhile [ $i -lt ${FAKE_NGPU:-1} ]; do echo \"GPU $i: NVIDIA H200 (UUID: GPU-$i)\"; "
       "i=$((i+1)); done\n")

check = pycheck.Checks(tail=4000)


def write_exe(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text.replace("#!/usr/bin/env python3", "#!" + sys.executable, 1))
    os.chmod(path, 0o755)


def make_tree(tmp, main_sh):
    """TMP/repo with the real mscx-main and fake tools; TMP/build with the tools the tuner needs."""
    repo = os.path.join(tmp, "repo")
    os.makedirs(os.path.join(repo, "tools", "ab"))
    shutil.copy(main_sh, os.path.join(repo, "tools", "ab", "mscx-main"))
    write_exe(os.path.join(repo, "tools", "tune", "mscx-tune"), FAKE)
    write_exe(os.path.join(repo, "tools", "ab", "mscx-ab"), FAKE)
    build = os.path.join(tmp, "build")
    for t in ("tools/perf/mscx-perf", "tools/mscx-plan", "tools/mscx-plangen"):
        write_exe(os.path.join(build, t), "#!/bin/sh\nexit 0\n")
    write_exe(os.path.join(tmp, "bin", "nvidia-smi"), SMI)
    return repo, build


def job(tmp, repo, build, ngpu, *args, env=None):
    log = os.path.join(tmp, "log.jsonl")
    if os.path.exists(log):
        os.unlink(log)
    ab = os.path.join(tmp, "ab-%d" % ngpu)
    shutil.rmtree(ab, ignore_errors=True)
    e = dict(os.environ, PATH=os.path.join(tmp, "bin") + os.pathsep + os.environ.get("PATH", ""),
             FAKE_NGPU=str(ngpu), FAKE_LOG=log, MSCX_AB_OUT=ab)
    e.pop("MSCX_PLAN_DIR", None)
    e.update(env or {})
    p = subprocess.run(["bash", os.path.join(repo, "tools", "ab", "mscx-main"), build, "--gpu"] + list(args),
                       env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=120)
    calls = [json.loads(l) for l in open(log)] if os.path.exists(log) else []
    return p, calls, ab


def opt(call, k):
    a = call["args"]
    return a[a.index(k) + 1] if k in a else None


def test_one_gpu(tmp, repo, build):
    p, calls, ab = job(tmp, repo, build, 1, "--tune-budget", "100", "--runs", "1")
    check("one GPU: the job passes", p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:])
    tunes = [c for c in calls if c["tool"] == "mscx-tune"]
    kinds = [(opt(c, "--nproc"), opt(c, "--executor"), opt(c, "--out")) for c in tunes]
    want = [(None, None, ab + "/tune-ws1")] + [(None, str(n), ab + "/tune-exec-n%d" % n) for n in (2, 4, 8)]
    check("one GPU: the tuner at world size 1, then --executor 2, 4, 8", kinds == want, kinds)
    budgets = [int(opt(c, "--budget")) for c in tunes]
    # each run gets an equal share of what is left; the fakes take no time, so nearly all of it is left
    check("one GPU: 100 s in all, each run an equal share of what is left", len(budgets) == 4
          and budgets[0] == 25 and all((95 // (4 - k)) <= b <= 100 // (4 - k) for k, b in enumerate(budgets)),
          budgets)
    check("every tuner run names the build and a run timeout",
          all(opt(c, "--build") == build and opt(c, "--run-timeout") == "120" for c in tunes), tunes)
    abs_ = [c for c in calls if c["tool"] == "mscx-ab"]
    check("one GPU: tuning comes before every A/B",
          calls and [c["tool"] for c in calls[:4]] == ["mscx-tune"] * 4 and len(abs_) == 7, calls)
    check("one GPU: the A/B against NCCL loads the tuned world-size-1 plans",
          abs_ and opt(abs_[0], "--plan-dir") == ab + "/tune-ws1/plans" and "--mode" not in abs_[0]["args"],
          abs_[:1])
    check("the executor A/Bs keep the shipped plans and the extra arguments reach every A/B only",
          all(opt(c, "--plan-dir") == "plans" for c in abs_[1:]) and all("--runs" in c["args"] for c in abs_)
          and not any("--runs" in c["args"] for c in tunes), abs_[1:2])
    check("one GPU: both kinds of table are printed",
          all("# fake tuner report tune-%s" % r in p.stdout for r in ("ws1", "exec-n2", "exec-n4", "exec-n8"))
          and "| size | fake ab table nccl-ws1 |" in p.stdout, p.stdout[-3000:])


def test_two_gpus(tmp, repo, build):
    p, calls, ab = job(tmp, repo, build, 2)
    tunes = [c for c in calls if c["tool"] == "mscx-tune"]
    abs_ = [c for c in calls if c["tool"] == "mscx-ab"]
    check("two GPUs: one tuner run, --nproc 2, the whole default budget",
          p.returncode == 0 and len(tunes) == 1 and opt(tunes[0], "--nproc") == "2"
          and opt(tunes[0], "--budget") == "600" and "--executor" not in tunes[0]["args"],
          p.stderr[-2000:] + json.dumps(tunes))
    check("two GPUs: the A/B loads the tuned plans", len(abs_) == 1 and opt(abs_[0], "--plan-dir")
          == ab + "/tune-ws2/plans", abs_)


def test_failures(tmp, repo, build):
    p, calls, ab = job(tmp, repo, build, 1, env={"FAKE_TUNE_FAIL": "tune-ws1"})
    abs_ = [c for c in calls if c["tool"] == "mscx-ab"]
    check("a failing tuner fails the job, is named, and the A/B uses the shipped plans",
          p.returncode != 0 and "SOME TUNING RUNS FAILED" in p.stderr and "FAILED (exit 1" in p.stdout
          and abs_ and opt(abs_[0], "--plan-dir") == "plans", p.stdout[-2000:] + p.stderr[-2000:])
    p, calls, _ = job(tmp, repo, build, 1, env={"FAKE_TUNE_FAIL": "exec-n4"})
    abs_ = [c for c in calls if c["tool"] == "mscx-ab"]
    check("a failing in-process tuner fails the job but not the tuned A/B",
          p.returncode != 0 and abs_ and opt(abs_[0], "--plan-dir").endswith("/tune-ws1/plans"),
          p.stderr[-2000:])
    p, calls, _ = job(tmp, repo, build, 1, "--no-tune")
    check("--no-tune: no tuner, the shipped plans", p.returncode == 0 and calls
          and all(c["tool"] == "mscx-ab" and opt(c, "--plan-dir") == "plans" for c in calls), calls[:2])
    for bad in ("abc", "0", ""):
        p, calls, _ = job(tmp, repo, build, 1, "--tune-budget", bad)
        check("--tune-budget '%s' is refused" % bad, p.returncode == 2 and "--tune-budget" in p.stderr
              and calls == [], p.stderr)
    os.unlink(os.path.join(build, "tools", "mscx-plangen"))
    p, calls, _ = job(tmp, repo, build, 1)
    check("a build without mscx-plangen: no tuning, said at WARN", p.returncode == 0 and "WARN" in p.stderr
          and "mscx-plangen" in p.stderr and not any(c["tool"] == "mscx-tune" for c in calls), p.stderr)


def main():
    main_sh = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="mscx-main-tune-test-")
    try:
        repo, build = make_tree(tmp, main_sh)
        test_one_gpu(tmp, repo, build)
        test_two_gpus(tmp, repo, build)
        test_failures(tmp, repo, build)
        sc = shutil.which("shellcheck")
        if sc:
            p = subprocess.run([sc, main_sh], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True)
            check("mscx-main is shellcheck-clean", p.returncode == 0, p.stdout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return check.done()


if __name__ == "__main__":
    sys.exit(main())
