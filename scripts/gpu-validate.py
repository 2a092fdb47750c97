#!/usr/bin/env python3
"""Validate gpuvisor on a real NVIDIA GPU: scenarios S1 and S2 of the product brief.

Usage: gpu-validate.py REPORT.md [--gpuvisor PATH] [--gpu N] [--timeout SECONDS]

Needs Python with JAX (CUDA), PyTorch (CUDA) and joblib, a built `gpuvisor` (found with
--gpuvisor, on PATH, or as target/release|debug/gpuvisor), and no internet. Each scenario runs
this same file in a worker mode under `gpuvisor exec` (and, for S1, once without it), and the
results go to REPORT.md as a markdown table. Exit status 0 only if every check passed.

Scenarios:
  S1   three JAX processes with default settings, started by joblib, each allocating half of
       its budget: all succeed under `exec --mem-per-process B` (B = a third of the GPU less
       headroom); without gpuvisor at least one fails (the first takes 75% of the card).
  S1b  JAX memory stats show the budget (bytes_limit <= budget).
  T1   torch inside a budget raises torch.OutOfMemoryError at the budget, with and without
       expandable segments (the VMM path); torch.cuda.mem_get_info() total is the budget.
  S2   a torch trainer with --children-cpu-only starts 4 CPU-only workers (spawn) that touch
       CUDA: the trainer keeps the GPU, each worker is refused a context and listed by pid.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30


# ----------------------------------------------------------------------------- workers

def barrier(directory, count, timeout=60.0):
    """Wait until `count` processes have arrived in `directory` (or timeout)."""
    open(os.path.join(directory, str(os.getpid())), "w").close()
    deadline = time.time() + timeout
    while len(os.listdir(directory)) < count and time.time() < deadline:
        time.sleep(0.05)


def jax_task(index, size_bytes, barrier_dir):
    """One joblib task: JAX with default settings, allocate, hold until all three have."""
    import jax
    import jax.numpy as jnp
    result = {"index": index, "pid": os.getpid()}
    try:
        device = jax.devices()[0]
        array = jnp.ones((size_bytes // 4,), dtype=jnp.float32)
        array.block_until_ready()
        stats = device.memory_stats() or {}
        result["bytes_limit"] = stats.get("bytes_limit")
        barrier(barrier_dir, 3)
        result["sum"] = float(jnp.sum(array[:1024]))
        result["ok"] = True
    except Exception as error:  # noqa: BLE001 - the point is to report any failure
        result["ok"] = False
        result["error"] = "%s: %s" % (type(error).__name__, str(error).splitlines()[0][:200])
        open(os.path.join(barrier_dir, "failed-%d" % os.getpid()), "w").close()
    return result


def worker_jax_parallel(size_bytes):
    from joblib import Parallel, delayed
    barrier_dir = tempfile.mkdtemp(prefix="gpuvisor-validate-")
    results = Parallel(n_jobs=3)(delayed(jax_task)(i, size_bytes, barrier_dir) for i in range(3))
    shutil.rmtree(barrier_dir, ignore_errors=True)
    print("RESULT " + json.dumps(results), flush=True)


def worker_torch_budget():
    import torch
    free, total = torch.cuda.mem_get_info()
    chunks, allocated, error = [], 0, None
    step = 256 << 20
    try:
        while allocated < 4 * total:
            chunks.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
            allocated += step
    except Exception as caught:  # noqa: BLE001
        error = caught
    out_of_memory_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    print("RESULT " + json.dumps({
        "free": free, "total": total, "allocated": allocated,
        "error_type": type(error).__name__ if error else None,
        "is_out_of_memory_error": isinstance(error, out_of_memory_type),
        "reserved": torch.cuda.memory_reserved(),
    }), flush=True)


def collector(queue):
    """A CPU-only worker that touches CUDA, like old torchrl collectors did."""
    import torch
    try:
        torch.zeros(1, device="cuda")
        queue.put((os.getpid(), "got a CUDA tensor"))
    except Exception as error:  # noqa: BLE001
        queue.put((os.getpid(), "refused: %s" % str(error).splitlines()[0][:120]))


def worker_trainer():
    import multiprocessing
    import torch
    tensor = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=collector, args=(queue,)) for _ in range(4)]
    for worker in workers:
        worker.start()
    outcomes = [queue.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join()
    print("RESULT " + json.dumps({"trainer_ok": bool(tensor.sum().item() == tensor.numel()),
                                  "workers": outcomes}), flush=True)


# ----------------------------------------------------------------------------- driver

def find_gpuvisor(explicit):
    candidates = [explicit] if explicit else []
    candidates.append(shutil.which("gpuvisor"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidates += [os.path.join(root, "target", kind, "gpuvisor") for kind in ("release", "debug")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    sys.exit("gpu-validate: no gpuvisor binary found; build it (cargo build --release) or pass --gpuvisor")


def run(command, timeout, env=None):
    started = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        code, stdout, stderr = "timeout", expired.stdout or "", expired.stderr or ""
        stdout = stdout if isinstance(stdout, str) else stdout.decode(errors="replace")
        stderr = stderr if isinstance(stderr, str) else stderr.decode(errors="replace")
    result = None
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    summary = None
    lines = stderr.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        try:
            summary = json.loads(lines[-1])
        except ValueError:
            pass
    return {"code": code, "result": result, "summary": summary, "stderr": stderr,
            "seconds": time.time() - started}


def gpu_total_bytes(gpuvisor, gpu):
    done = subprocess.run([gpuvisor, "gpus", "--json"], capture_output=True, text=True, check=True)
    gpus = json.loads(done.stdout)["gpus"]
    return next(item for item in gpus if item["index"] == gpu)["total_bytes"]


def tail(text, lines=3):
    return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:]).replace("|", "\\|")[:300]


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--worker":
        mode = sys.argv[2]
        if mode == "jax-parallel":
            worker_jax_parallel(int(sys.argv[3]))
        elif mode == "torch-budget":
            worker_torch_budget()
        elif mode == "trainer":
            worker_trainer()
        return 0

    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    report = args[0]
    option = lambda name, default: args[args.index(name) + 1] if name in args else default  # noqa: E731
    gpuvisor = find_gpuvisor(option("--gpuvisor", None))
    gpu = int(option("--gpu", "0"))
    timeout = float(option("--timeout", "600"))
    me = [sys.executable, os.path.abspath(__file__), "--worker"]
    total = gpu_total_bytes(gpuvisor, gpu)
    budget = (total // 3 - 2 * GIB) // GIB * GIB
    job = budget // 2
    budget_text = "%dGiB" % (budget // GIB)
    exec_base = [gpuvisor, "exec", "--json", "--gpu", str(gpu)]
    rows = []

    def row(name, command, expected, observed, passed):
        rows.append((name, " ".join(command).replace(gpuvisor, "gpuvisor").replace(sys.executable, "python"),
                     expected, observed, "PASS" if passed else "FAIL"))

    # S1 without gpuvisor: at least one of the three fails.
    command = me + ["jax-parallel", str(job)]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
    bare = run(command, timeout, env)
    results = bare["result"] or []
    failed = [item for item in results if not item.get("ok")]
    row("S1 without gpuvisor", command, "at least one of 3 JAX processes fails",
        "%d of %d failed: %s" % (len(failed), len(results), failed[0]["error"] if failed else tail(bare["stderr"])),
        bool(failed) or bare["code"] != 0)

    # S1 with gpuvisor: all three succeed, each sees a budget-sized device.
    command = exec_base + ["--mem-per-process", budget_text, "--"] + me + ["jax-parallel", str(job)]
    s1 = run(command, timeout)
    results = s1["result"] or []
    ok = len(results) == 3 and all(item.get("ok") for item in results)
    row("S1 with gpuvisor", command, "all 3 JAX processes succeed",
        "%d of %d succeeded (exit %s)%s" % (sum(1 for item in results if item.get("ok")), len(results), s1["code"],
                                            "" if ok else ": " + tail(s1["stderr"])),
        ok and s1["code"] == 0)
    limits = [item.get("bytes_limit") for item in results if item.get("ok")]
    row("S1b JAX memory stats", command, "bytes_limit <= budget (%s)" % budget_text,
        "bytes_limit: %s" % ", ".join("%.2f GiB" % (limit / GIB) for limit in limits if limit),
        bool(limits) and all(limit and limit <= budget for limit in limits))

    # T1: torch raises OutOfMemoryError at the budget (classic and expandable segments).
    torch_budget = 8 * GIB
    for framework, label in (("none", "cudaMalloc"), ("torch", "expandable segments")):
        command = exec_base + ["--mem-per-process", "8GiB", "--framework", framework, "--"] + me + ["torch-budget"]
        t1 = run(command, timeout)
        result = t1["result"] or {}
        allocated = result.get("allocated", 0)
        passed = (result.get("is_out_of_memory_error") and result.get("total") == torch_budget
                  and torch_budget - 2 * GIB <= allocated <= torch_budget)
        row("T1 torch budget (%s)" % label, command,
            "mem_get_info total = 8 GiB; OutOfMemoryError after 6-8 GiB",
            "total %.2f GiB, free %.2f GiB, %s after %.2f GiB" % (result.get("total", 0) / GIB, result.get("free", 0) / GIB,
                                                                result.get("error_type"), allocated / GIB)
            if result else tail(t1["stderr"]),
            bool(passed))

    # S2: CPU-only workers are refused a context and listed.
    command = exec_base + ["--mem", "8GiB", "--framework", "torch", "--children-cpu-only", "--"] + me + ["trainer"]
    s2 = run(command, timeout)
    result = s2["result"] or {}
    workers = result.get("workers", [])
    refused = [pid for pid, outcome in workers if outcome.startswith("refused")]
    listed = [item["pid"] for item in (s2["summary"] or {}).get("processes", []) if item.get("cpu_only_violation")]
    passed = result.get("trainer_ok") and len(refused) == 4 and sorted(refused) == sorted(listed)
    row("S2 CPU-only workers", command, "trainer keeps the GPU; 4 workers refused and listed by pid",
        "trainer ok: %s; refused: %s; listed by gpuvisor: %s" % (result.get("trainer_ok"), refused, listed)
        if result else tail(s2["stderr"]),
        bool(passed))

    with open(report, "w") as out:
        out.write("# gpuvisor GPU validation\n\n")
        out.write("GPU %d: %.1f GiB; per-process budget %s; JAX job %.1f GiB per process.\n\n"
                  % (gpu, total / GIB, budget_text, job / GIB))
        out.write("| scenario | command | expected | observed | result |\n|---|---|---|---|---|\n")
        for name, command_text, expected, observed, verdict in rows:
            out.write("| %s | `%s` | %s | %s | %s |\n" % (name, command_text, expected, observed.replace("|", "\\|"), verdict))
    print(open(report).read())
    return 0 if all(verdict == "PASS" for *_, verdict in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
