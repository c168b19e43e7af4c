"""The nightly GPU job script (ci/nightly_gpu.py), run on the simulated device: a real
campaign with a planted fault, crashing and hanging workers (a stand-in worker command),
the sanitizer verdict (a stand-in sanitizer) and usage errors."""
import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "ci", "nightly_gpu.py")

# Stands in for 'python -m overlapcheck': the fuzz arguments come after it. What it does
# depends on the campaign's seed (the first seed of these tests is 100).
FAKE_WORKER = textwrap.dedent("""
    import json, os, sys, time
    args = sys.argv[1:]
    seed = int(args[args.index("--seed") + 1])
    out = args[args.index("--out") + 1]
    if seed == 100:      # a CUDA fatal error after a repro was written: SIGABRT
        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, "early.yaml"), "w").write("schema: 1\\n")
        sys.stderr.write("RuntimeError: CUDA error: an illegal memory access was encountered\\n")
        sys.stderr.flush()
        os.abort()
    if seed == 101:      # a shell-style abort exit code
        sys.exit(134)
    if seed == 103:      # an uncaught exception: exit 1 without a summary
        raise RuntimeError("worker blew up")
    if seed == 104:      # hangs: killed at the end of its time box plus grace
        time.sleep(120)
    model = args[args.index("--model") + 1]
    if model == "slow":  # a model whose workers outlive their time box
        time.sleep(120)
    if model == "fast":  # fuzzes for its time box, 3 examples
        time.sleep(float(args[args.index("--time") + 1]))
        print(json.dumps({"examples": 3, "steps": 30, "findings": []}))
        sys.exit(0)
    print(json.dumps({"examples": 5, "steps": 50, "findings": []}))
""")

# Stands in for compute-sanitizer: reports two errors and the allocator setting it saw.
FAKE_SANITIZER = textwrap.dedent("""\
    #!/bin/sh
    echo "========= COMPUTE-SANITIZER"
    echo "alloc conf: $PYTORCH_CUDA_ALLOC_CONF"
    echo "========= ERROR SUMMARY: 2 errors"
""")


def nightly(*args, timeout=240):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def summary(out):
    with open(os.path.join(out, "summary.json")) as fh:
        return json.load(fh)


def test_sim_dry_run_records_findings_with_repros_and_keeps_the_database(tmp_path):
    out = str(tmp_path / "out")
    r = nightly("--device", "sim", "--minutes", "1", "--campaign-seconds", "10",
                "--max-campaigns", "1", "--models", "oracle", "--fault", "unaligned-tail-free",
                "--shrink-seconds", "2", "--seed", "7", "--out", out, "--sanitizer", "/nonexistent/cs")
    assert r.returncode == 1, r.stdout + r.stderr
    s = summary(out)
    (c,) = s["campaigns"]
    assert (c["status"], c["exit_code"], c["seed"], c["model"]) == ("findings", 1, 7, "oracle")
    assert c["examples"] > 0 and c["steps"] > 0 and "--device sim" in c["command"]
    assert c["findings"] and all(f["kind"] == "checker" for f in c["findings"])
    for f in c["findings"]:
        assert os.path.exists(f["repro"]) and os.path.exists(f["trace"])
        assert f["reproduce"].startswith("overlapcheck replay ")
    assert os.listdir(os.path.join(out, "hypothesis-db")), "failing examples kept in the database"
    assert s["sanitizer"]["verdict"] == "skipped" and "not on PATH" in s["sanitizer"]["note"]
    assert s["totals"]["findings"] == len(c["findings"]) and s["totals"]["crashes"] == 0
    assert s["per_model"] == {"oracle": {
        "campaigns": 1, "share_s": 60.0, "seconds": round(c["wall_s"], 1), "examples": c["examples"],
        "steps": c["steps"], "findings": len(c["findings"]), "crashes": 0}}
    assert f"oracle: 1 campaign(s), {c['examples']} examples" in r.stdout


def test_crashing_workers_are_findings_and_the_campaign_goes_on(tmp_path):
    worker, sanitizer = tmp_path / "worker.py", tmp_path / "sanitizer.sh"
    worker.write_text(FAKE_WORKER)
    sanitizer.write_text(FAKE_SANITIZER)
    sanitizer.chmod(0o755)
    out = str(tmp_path / "out")
    r = nightly("--device", "sim", "--minutes", "5", "--campaign-seconds", "1",
                "--max-campaigns", "4", "--models", "oracle,tiny", "--seed", "100", "--out", out,
                "--worker-cmd", f"{sys.executable} {worker}", "--sanitizer", str(sanitizer))
    assert r.returncode == 1, r.stdout + r.stderr
    s = summary(out)
    got = [(c["seed"], c["model"], c["status"], c["exit_code"], c["signal"]) for c in s["campaigns"]]
    assert got == [(100, "oracle", "crash", -6, "SIGABRT"), (101, "tiny", "crash", 134, "SIGABRT"),
                   (102, "oracle", "clean", 0, None), (103, "tiny", "crash", 1, None)]
    abort = s["campaigns"][0]["findings"][0]
    assert abort["kind"] == "crash" and abort["cuda_fatal"] and abort["seed"] == 100
    assert "illegal memory access" in abort["stderr_tail"]
    assert abort["repros"] == ["repros/c00-oracle-s100/early.yaml"]
    assert "--seed 100" in abort["reproduce"] and "fuzz --device sim" in abort["reproduce"]
    assert "worker blew up" in s["campaigns"][3]["findings"][0]["stderr_tail"]
    assert s["campaigns"][2]["examples"] == 5 and not s["campaigns"][2]["findings"]
    assert s["totals"]["crashes"] == 3 and s["totals"]["by_status"] == {"clean": 1, "crash": 3}
    assert {m: (p["campaigns"], p["examples"]) for m, p in s["per_model"].items()} == \
        {"oracle": (2, 5), "tiny": (2, 0)}
    san = s["sanitizer"]
    assert (san["verdict"], san["errors"]) == ("errors", 2)
    assert "--track-stream-ordered-races all" in san["command"]
    with open(os.path.join(out, san["log"])) as fh:
        assert "alloc conf: backend:cudaMallocAsync" in fh.read()


def test_a_hanging_worker_is_killed_and_recorded_as_a_timeout(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    out = str(tmp_path / "out")
    r = nightly("--device", "sim", "--minutes", "5", "--campaign-seconds", "1", "--grace", "1",
                "--max-campaigns", "1", "--seed", "104", "--out", out, "--no-sanitizer",
                "--worker-cmd", f"{sys.executable} {worker}", timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    (c,) = summary(out)["campaigns"]
    assert c["status"] == "timeout" and c["exit_code"] is None and c["wall_s"] < 30
    assert c["findings"][0]["kind"] == "timeout"
    assert summary(out)["sanitizer"]["verdict"] == "skipped"


def test_bad_flags_exit_2_with_one_line():
    for args in (["--bogus"], ["--minutes", "0"], ["--device", "tpu"], ["--models", ","],
                 ["--max-campaigns", "-1"], ["--startup-seconds", "0"]):
        r = nightly(*args, timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "error" in r.stderr, (args, r.stderr)
    r = nightly("--help", timeout=60)
    assert r.returncode == 0 and "--minutes" in r.stdout and "--worker-cmd" in r.stdout


def test_a_slow_model_spends_its_own_share_not_the_others(tmp_path):
    """Two models, 12 s: 6 s each. The slow one's worker hangs; its grace is capped by
    its share, so the fast one still gets its campaigns (cycling with a 30 s grace, the
    slow one's first campaign alone outlasted the budget)."""
    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    out = str(tmp_path / "out")
    r = nightly("--device", "sim", "--minutes", "0.2", "--campaign-seconds", "1", "--grace", "30",
                "--shrink-seconds", "1", "--startup-seconds", "0.5", "--models", "slow,fast",
                "--seed", "1", "--out", out, "--no-sanitizer",
                "--worker-cmd", f"{sys.executable} {worker}", timeout=90)
    assert r.returncode == 1, r.stdout + r.stderr     # the slow model's timeout is a finding
    s = summary(out)
    models = [c["model"] for c in s["campaigns"]]
    assert models[:2] == ["slow", "fast"] and models.count("slow") == 1, models
    slow, fast = s["per_model"]["slow"], s["per_model"]["fast"]
    assert s["campaigns"][0]["status"] == "timeout" and s["campaigns"][0]["grace_s"] < 6
    assert slow["share_s"] == fast["share_s"] == 6.0
    assert slow["seconds"] < 6.0 + 2 and fast["seconds"] < 6.0 + 2
    assert fast["campaigns"] >= 3 and fast["examples"] == 3 * fast["campaigns"], fast
    assert (slow["examples"], slow["crashes"]) == (0, 1)
    assert f"fast: {fast['campaigns']} campaign(s), {fast['examples']} examples" in r.stdout
