#!/usr/bin/env python3
"""Regenerates docs/benchmarks.md: every performance figure of gpuvisor, measured in one run.

Usage: python3 scripts/bench.py [--quick] [--only SECTION ...] [--output FILE] [--charts-only]

Each section measures side by side where there is a comparison (with and without the shim,
gpuvisor against other tools) and reports ratios, so the figures hold on any machine of the
same kind. Needs: cargo, cc, and valgrind for instruction counts (skipped without it).
Sections: planner, explain, shim-alloc, shim-startup, supervisor, sampler, cluster, refusals,
dryrun (needs a FakeGPU checkout in $FAKEGPU_DIR for its FakeGPU columns), python, queue, scale. --quick runs each with
fewer iterations and repetitions (a smoke test of the script, about a minute once built).

Every section also gets a chart, docs/benchmarks/<section>.svg (next to --output), drawn from the
table the section just printed and embedded after it (scripts/bench_section_charts.py).
--charts-only measures nothing: it re-reads the tables already in the page and redraws every chart.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_section_charts import redraw, with_chart

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"


def replace_section(heading, text, doc_path=DOC):
    """Replaces the `## heading` section of docs/benchmarks.md with `text` (appends it if absent):
    how the single-section scripts (bench_supervisor.py, bench_sampler.py --write) update it."""
    doc = doc_path.read_text() if doc_path.exists() else "# Benchmarks\n"
    start = doc.find(f"## {heading}")
    if start >= 0:
        end = doc.find("\n## ", start + 1)
        doc = doc[:start] + text + ("\n" + doc[end:] if end >= 0 else "\n")
    else:
        doc = doc.rstrip() + "\n\n" + text + "\n"
    doc_path.write_text(doc)


def sh(args, **kwargs):
    """Runs a command, failing loudly with its output."""
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"bench: {' '.join(map(str, args))} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def machine():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, {platform.system()} {platform.release()}"


def build():
    sh(["cargo", "build", "--release", "-p", "gpuvisor-cli"], cwd=ROOT)
    # Where cargo put it: CARGO_TARGET_DIR when set (relative to ROOT, as cargo reads it).
    return ROOT / os.environ.get("CARGO_TARGET_DIR", "target") / "release" / "gpuvisor"


def median(values):
    return statistics.median(values)


def quartiles(values):
    """The first and third quartiles: the spread shown next to a median."""
    values = sorted(values)
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def fmt_ns(value):
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


# ----------------------------------------------------------------------------------------------
# Planner


PLANNER_PROSE = """\
What is measured: `gpuvisor_core::plan::plan(&job, &inventory)` for a job of **1,000 replicas
over 8 GPUs** (simulated `8xh100`): a learner on all 8 GPUs at 10%, 800 actors at 100 MiB, 100
evaluators at 1%, 99 simulator replicas taking the rest, 300 MiB context overhead, 1 GiB
reserve. The whole plan is built each iteration, including every replica's argv and
environment. The job and inventory are built once, outside the timed loop. Target: under
10 ms.

Method: criterion (`crates/gpuvisor-core/benches/plan.rs`, `harness = false`, default
features off), run as `cargo bench -p gpuvisor-core --bench plan`. The table gives criterion's
interval (low / **estimate** / high) for the time of one plan."""

PLANNER_NOTES = """\
The planner is O(replicas x GPUs log GPUs): each replica looks at every allowed GPU once
(spread and rest sort at most 8 candidates). Most of the time goes to building the output
(argv, env and UUID strings per replica), not to placement.

The last row is the error path, for the same job with the actors raised to 600 MiB so it no
longer fits. It renders every GPU's arithmetic and builds a hint whose numbers are checked:
"the whole job fits with N replicas" and "with memory = X the whole job fits" come from binary
searches that re-plan variants of the job without messages, about twenty plans here. It runs
once, when a job is refused, so it has no target beyond feeling instant."""

CRITERION_UNITS = {"ps": 1e-12, "ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def criterion_estimates(output):
    """(name, (low, estimate, high) in seconds) for every benchmark in criterion's output; a
    long name sits on its own line above `time: [...]`."""
    results = []
    pattern = re.compile(r"^(\S[^\n]*?)\s*\n?\s+time:\s+\[(\S+) (\S+) (\S+) (\S+) (\S+) (\S+)\]", re.M)
    for match in pattern.finditer(output):
        name = match.group(1).strip()
        values = [float(match.group(i)) * CRITERION_UNITS[match.group(i + 1)] for i in (2, 4, 6)]
        results.append((name, tuple(values)))
    if not results:
        sys.exit(f"bench: no criterion estimates in:\n{output}")
    return results


def fmt_seconds(seconds):
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def section_planner(args):
    command = ["cargo", "bench", "-p", "gpuvisor-core", "--bench", "plan", "--"]
    if args.quick:
        command += ["--warm-up-time", "1", "--measurement-time", "2"]
    result = sh(command, cwd=ROOT)
    rows = criterion_estimates(result.stdout)
    lines = ["## Planner", "", PLANNER_PROSE, "",
             "| benchmark | time per plan (low / **estimate** / high) |", "|---|---|"]
    for name, (low, mid, high) in rows:
        lines.append(f"| {name} | {fmt_seconds(low)} / **{fmt_seconds(mid)}** / {fmt_seconds(high)} |")
    plans = [mid for name, (_, mid, _) in rows if name.startswith("plan ")]
    if plans:
        worst = max(plans)
        verdict = f"{10e-3 / worst:.0f}x under" if worst < 10e-3 else "OVER"
        lines += ["", f"Reading: planning 1,000 replicas over 8 GPUs takes {fmt_seconds(worst)} at most, "
                      f"{verdict} the 10 ms target."]
    lines += [""]
    lines += [PLANNER_NOTES]
    return lines


def _explain_block(seed=7, target=8 << 20):
    """About 8 MiB of ordinary training-log lines (no failure), mixed the way real logs are."""
    import random
    rng = random.Random(seed)
    templates = [
        "[rank{r}] step {n} | loss {f:.4f} | lr 3.0e-04 | grad_norm {g:.3f} | {t} tokens/s | mem {mb} MiB",
        "{d} I external/xla/xla/service/service.cc:168] XLA service 0x{h:x} initialized for platform CUDA (this does not guarantee that XLA will be used). Devices:",
        "INFO:train:epoch {c} batch {n}/{t} reward={f:.3f} episode_len={t} fps={mb}",
        "  File \"/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py\", line {n}, in _call_impl",
        "{d} W warnings.py:109] UserWarning: The given NumPy array is not writable, and PyTorch does not support non-writable tensors.",
        "{{\"step\": {n}, \"loss\": {f:.5f}, \"throughput\": {t}, \"gpu_mem_gib\": {g:.2f}}}",
        "Epoch {c}:  {p}%|####      | {n}/{t} [02:11<03:09,  3.12it/s, loss={f:.3f}]",
        "[collector-{c}] frames={t} fps={mb} episodes={n} return_mean={f:.2f}",
        "node{c}:{t}:{t} [{c}] NCCL INFO Channel 0{c}/0 : {c}[{c}] -> {r}[{r}] via P2P/IPC/read",
    ]
    weights = [30, 5, 20, 8, 5, 20, 10, 10, 0.2]
    lines, size = [], 0
    while size < target:
        line = rng.choices(templates, weights)[0].format(
            r=rng.randrange(8), n=rng.randrange(10**6), f=rng.random() * 5, g=rng.random() * 10,
            t=rng.randrange(10**5), mb=rng.randrange(80000), h=rng.getrandbits(40), c=rng.randrange(8),
            p=rng.randrange(100), d=f"2026-11-21 0{rng.randrange(10)}:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(10**6):06d}:")
        lines.append(line)
        size += len(line) + 1
    return ("\n".join(lines) + "\n").encode()


def _timed(command, runs):
    """Median wall seconds and median CPU seconds (user + system) of `command`, output discarded."""
    walls, cpus = [], []
    for _ in range(runs):
        before = os.times()
        start = time.perf_counter()
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        walls.append(time.perf_counter() - start)
        after = os.times()
        cpus.append((after.children_user - before.children_user) + (after.children_system - before.children_system))
        if result.returncode != 0:
            sys.exit(f"bench: {command} failed: {result.stderr.decode(errors='replace')}")
    return statistics.median(walls), statistics.median(cpus), result.stdout.decode(errors="replace")


def section_explain(args):
    """`gpuvisor explain` on a 1 GiB log against `wc -l` (the cost of reading it at all)."""
    binary = build()
    runs = 1 if args.quick else 5
    size = (256 << 20) if args.quick else (1 << 30)
    threads = len(os.sched_getaffinity(0))
    load_before = load_average()
    commands = {
        "wc": (["wc", "-l"], {}),
        "explain": ([str(binary), "explain"], {}),
        "explain-1": ([str(binary), "explain"], {"GPUVISOR_EXPLAIN_THREADS": "1"}),
    }
    times = {name: ([], []) for name in commands}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        block = _explain_block()
        with open(log, "wb") as out:
            written = 0
            while written < size:
                out.write(block)
                written += len(block)
            out.write(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use. Of the allocated memory 68.52 GiB is allocated by PyTorch, and 8.93 GiB is reserved by PyTorch but unallocated.\n")
        gib = log.stat().st_size / 2**30
        # Interleaved, so that a change in the machine's load hits every command alike.
        for _ in range(runs):
            for name, (command, env) in commands.items():
                before = os.times()
                start = time.perf_counter()
                result = subprocess.run(command + [str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env={**os.environ, **env})
                times[name][0].append(time.perf_counter() - start)
                after = os.times()
                times[name][1].append((after.children_user - before.children_user)
                                      + (after.children_system - before.children_system))
                if result.returncode != 0:
                    sys.exit(f"bench: {command} failed: {result.stderr.decode(errors='replace')}")
                if name != "wc" and b"rule torch-oom/fragmentation" not in result.stdout:
                    sys.exit("bench: explain did not find the failure at the end of the log:\n"
                             + result.stdout.decode(errors="replace")[:2000])
    wall = {name: statistics.median(walls) for name, (walls, _) in times.items()}
    cpu = {name: statistics.median(cpus) for name, (_, cpus) in times.items()}
    rows = [("`gpuvisor explain train.log`" + (f" ({threads} threads)" if threads > 1 else ""), "explain"),
            ("`gpuvisor explain train.log`, one thread (GPUVISOR_EXPLAIN_THREADS=1)", "explain-1"),
            ("`wc -l train.log` (reading floor)", "wc")]
    lines = ["## Explain", "",
             "What is measured: `gpuvisor explain train.log` (release build, all built-in rules) on a "
             f"**{gib:.2f} GiB log**: ordinary training-log lines (progress bars, per-step metrics, XLA and NCCL "
             "info lines, warnings, JSON metrics) with a PyTorch out-of-memory message on the very last line, "
             "which must be found. `wc -l` on the same file is the floor: the cost of reading it at all. "
             "Target: at most 5x `wc -l`.", "",
             f"Command (generates the log in a temporary directory, page cache warm; the three commands "
             f"interleaved, median of {runs} runs each):", "",
             "```sh", "python3 scripts/bench.py --only explain", "```", "",
             "Source: `section_explain` in `scripts/bench.py`; the matcher is "
             "`crates/gpuvisor-observe/src/explain/scan.rs` and `scan/parallel.rs`.", "",
             f"Load average {load_before} before the runs and {load_average()} after, on {threads} cores shared "
             "with other builds: absolute times are pessimistic; read the ratios.", "",
             "| command | wall | CPU | throughput (wall) | wall / `wc -l` |", "|---|---|---|---|---|"]
    for label, name in rows:
        lines.append(f"| {label} | {wall[name]:.2f} s | {cpu[name]:.2f} s | {gib / wall[name]:.2f} GiB/s "
                     f"| {wall[name] / wall['wc']:.1f}x |")
    lines += ["", "The blocks of the log are matched on as many threads as there are cores (at most 4) and "
              "merged in order; the one-thread row is the same binary with `GPUVISOR_EXPLAIN_THREADS=1`. "
              "Where the time goes, and what changed it, is in docs/explain.md (\"How it works, and how fast\")."]
    return lines


# ----------------------------------------------------------------------------------------------
# The shim: added cost per allocation, start-up of many processes

SIM_SPEC = "1x80GiB"
BUDGET = "70GiB"


class Tools:
    """The release `gpuvisor`, the shim and simulator it writes to its cache, and the C
    programs of bench/ compiled against that simulator; built once per run."""

    _built = None

    @classmethod
    def get(cls):
        if cls._built is None:
            cls._built = cls()
        return cls._built

    def __init__(self):
        self.gpuvisor = build()
        self.work = Path(tempfile.mkdtemp(prefix="gpuvisor-bench-"))
        # Ask the binary where it put its libraries: exactly what `exec --simulate` preloads.
        probe = sh([str(self.gpuvisor), "exec", "--simulate", SIM_SPEC, "--", "sh", "-c",
                    'printf "%s\\n%s\\n" "$LD_PRELOAD" "$LD_LIBRARY_PATH"'])
        preload, library_path = probe.stdout.splitlines()[:2]
        self.shim = Path(preload.split(":")[0])
        self.sim_dir = Path(library_path.split(":")[0])
        if not (self.shim.is_file() and (self.sim_dir / "libcuda.so.1").is_file()):
            sys.exit(f"bench: gpuvisor exec did not name its shim and simulator ({probe.stdout!r})")
        self.programs = {}
        for name, flags in [("alloc_free", ["-pthread"]), ("first_use", []), ("spawn_many", [])]:
            output = self.work / name
            link = [] if name == "spawn_many" else [f"-L{self.sim_dir}", "-l:libcuda.so.1"]
            sh(["cc", "-O2", *flags, str(ROOT / "bench" / f"{name}.c"), *link, "-o", str(output)])
            self.programs[name] = str(output)
        self.states = 0

    def direct_env(self):
        """The environment of a run against the simulator alone: the same simulated machine
        and a fresh shared state file, as `exec --simulate` gives, but no shim and no ledger."""
        self.states += 1
        state = Path("/dev/shm" if os.path.isdir("/dev/shm") else self.work) / f"gpuvisor-bench-{os.getpid()}-{self.states}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUVISOR_", "LD_PRELOAD"))}
        env.update(LD_LIBRARY_PATH=str(self.sim_dir), GPUVISOR_SIM_GPUS=SIM_SPEC.split("x", 1)[1],
                   GPUVISOR_SIM_STATE=str(state))
        return env, state

    def run_direct(self, argv):
        env, state = self.direct_env()
        try:
            return sh(argv, env=env).stdout
        finally:
            state.unlink(missing_ok=True)

    def run_shim(self, argv, json_summary=False):
        """`argv` under `gpuvisor exec` with a budget: the shim preloaded, every process
        registered in the ledger. Returns (stdout, the summary as a dict or None)."""
        command = [str(self.gpuvisor), "exec", "--simulate", SIM_SPEC, "--mem", BUDGET]
        command += ["--json"] if json_summary else []
        result = sh(command + ["--", *argv])
        summary = None
        if json_summary:
            summary = json.loads(result.stderr.strip().splitlines()[-1])
        return result.stdout, summary

    def cleanup(self):
        shutil.rmtree(self.work, ignore_errors=True)


def fields(line):
    """`key=value` pairs of a benchmark program's output line, values as floats."""
    return {key: float(value) for key, value in re.findall(r"(\w+)=([0-9.]+)", line)}


def instructions_per_pair(tools, quick):
    """Instructions per alloc+free pair with and without the shim: two runs of different
    lengths each, differenced, so start-up and exit cancel out. None without valgrind."""
    if not shutil.which("valgrind"):
        return None
    short, long = (2_000, 6_000) if quick else (10_000, 30_000)
    counts = {}
    for variant in ("direct", "shim"):
        for iterations in (short, long):
            counter = tools.work / f"callgrind-{variant}-{iterations}"
            argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counter}",
                    tools.programs["alloc_free"], "1", str(iterations)]
            if variant == "direct":
                tools.run_direct(argv)
            else:
                tools.run_shim(argv)
            total = re.search(r"^summary:\s+(\d+)", counter.read_text(), re.M)
            if not total:
                sys.exit(f"bench: no instruction total in {counter}")
            counts[variant, iterations] = int(total.group(1))
    # alloc_free runs iterations/10 warm-up pairs on top of the timed ones.
    pairs = (long - short) * 1.1
    return {variant: (counts[variant, long] - counts[variant, short]) / pairs for variant in ("direct", "shim")}


def section_shim_alloc(args):
    tools = Tools.get()
    repetitions = 2 if args.quick else 11
    plans = [(1, 100_000 if args.quick else 1_000_000), (8, 20_000 if args.quick else 200_000)]
    samples = {}  # (threads, variant) -> list of field dicts
    for repetition in range(repetitions):
        for threads, iterations in plans:
            argv = [tools.programs["alloc_free"], str(threads), str(iterations)]
            # Alternate which goes first, so a drift in machine load hits both alike.
            order = ("direct", "shim") if repetition % 2 == 0 else ("shim", "direct")
            for variant in order:
                out = tools.run_direct(argv) if variant == "direct" else tools.run_shim(argv)[0]
                samples.setdefault((threads, variant), []).append(fields(out))
    instructions = instructions_per_pair(tools, args.quick)

    lines = ["## Shim: added cost per allocation", "",
             "Target: the shim adds at most 50 ns to one `cuMemAlloc_v2` + `cuMemFree_v2` pair, "
             "single-threaded.", "",
             "Method: `bench/alloc_free.c` makes THREADS threads, each with device 0's primary "
             "context current, warm up, then run N alloc+free pairs of 1 MiB. It runs against the "
             f"simulator alone (`LD_LIBRARY_PATH` = the simulator gpuvisor writes to its cache, "
             f"`GPUVISOR_SIM_GPUS={SIM_SPEC.split('x', 1)[1]}`, a fresh `GPUVISOR_SIM_STATE`) and under "
             f"`gpuvisor exec --simulate {SIM_SPEC} --mem {BUDGET} -- alloc_free THREADS N` (shim "
             "preloaded, a ledger budget far from full), the two interleaved, "
             f"{repetitions} repetitions each; medians. *CPU ns/pair* is the process's CPU time over "
             "all pairs (the work a pair costs); *wall ns/pair* is elapsed time over one thread's "
             "pairs (what one thread sees, waiting for a core included). Threads: "
             + ", ".join(f"{t} x {n:,} pairs" for t, n in plans) + ".", "",
             "| threads | measure | simulator alone | with shim | added by shim | ratio |",
             "|---|---|---|---|---|---|"]
    added_cpu_1 = None
    for threads, _ in plans:
        for key, label in [("cpu_ns_per_pair", "CPU ns/pair"), ("ns_per_pair", "wall ns/pair")]:
            direct_values = [s[key] for s in samples[threads, "direct"]]
            shim_values = [s[key] for s in samples[threads, "shim"]]
            direct, shim = median(direct_values), median(shim_values)
            if threads == 1 and key == "cpu_ns_per_pair":
                added_cpu_1 = shim - direct

            def cell(value, values):
                low, high = quartiles(values)
                return f"{fmt_ns(value)} ({fmt_ns(low)}–{fmt_ns(high)})"

            lines.append(f"| {threads} | {label} | {cell(direct, direct_values)} | {cell(shim, shim_values)} | "
                         f"{fmt_ns(shim - direct)} | {shim / direct:.2f}x |")
    if instructions:
        direct, shim = instructions["direct"], instructions["shim"]
        lines.append(f"| 1 | instructions/pair (callgrind) | {direct:,.0f} | {shim:,.0f} | "
                     f"{shim - direct:,.0f} | {shim / direct:.2f}x |")
    lines += ["",
              "Times: median (interquartile range). "
              "The instruction counts come from `valgrind --tool=callgrind` on two single-threaded "
              "runs of different lengths per variant, differenced so start-up cancels; unlike the "
              "times they do not depend on the machine's load.", ""]
    cores = os.cpu_count() or 1
    if cores < 8:
        lines += [f"This machine has {cores} cores: the 8-thread rows measure 8 threads contending "
                  f"for {cores} cores (shared cache lines, preemption inside critical sections), "
                  "not 8-way parallel throughput; read their CPU ns/pair, not the wall time.", ""]
    verdict = "within" if added_cpu_1 is not None and added_cpu_1 <= 50 else "OVER"
    extra = ""
    if instructions:
        extra = f" ({instructions['shim'] - instructions['direct']:,.0f} instructions)"
    lines += [f"Reading: single-threaded, the shim adds {fmt_ns(added_cpu_1)} ns of CPU per pair{extra}, "
              f"{verdict} the 50 ns target."]
    return lines


def first_use_instructions(tools):
    """Instructions of one whole `first_use` process, with and without the shim; None without
    valgrind."""
    if not shutil.which("valgrind"):
        return None
    counts = {}
    for variant in ("direct", "shim"):
        counter = tools.work / f"callgrind-first-use-{variant}"
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counter}", tools.programs["first_use"]]
        if variant == "direct":
            tools.run_direct(argv)
        else:
            tools.run_shim(argv)
        total = re.search(r"^summary:\s+(\d+)", counter.read_text(), re.M)
        if not total:
            sys.exit(f"bench: no instruction total in {counter}")
        counts[variant] = int(total.group(1))
    return counts


def section_shim_startup(args):
    tools = Tools.get()
    repetitions = 2 if args.quick else 7
    processes = 256
    argv = [tools.programs["spawn_many"], str(processes), tools.programs["first_use"]]
    seconds = {"direct": [], "shim": [], "exec": []}
    registered = []
    for repetition in range(repetitions):
        order = ("direct", "shim") if repetition % 2 == 0 else ("shim", "direct")
        for variant in order:
            if variant == "direct":
                out = tools.run_direct(argv)
            else:
                started = time.monotonic()
                out, summary = tools.run_shim(argv, json_summary=True)
                seconds["exec"].append(time.monotonic() - started)
                # Every first_use process must be in the ledger with its 1 MiB.
                registered.append(sum(1 for p in summary["processes"] if max(p["peak_bytes"], default=0) >= 1 << 20))
            result = fields(out)
            if result.get("failed", 1) != 0:
                sys.exit(f"bench: {variant} start-up run had failures: {out}")
            seconds[variant].append(result["seconds"])
    direct, shim = median(seconds["direct"]), median(seconds["shim"])

    def ms_cell(values):
        low, high = quartiles(values)
        return f"{median(values) * 1e3:,.0f} ms ({low * 1e3:,.0f}–{high * 1e3:,.0f})"

    per_process = first_use_instructions(tools)
    lines = ["## Shim: start-up of many processes", "",
             f"Target: {processes} processes, each registering in the ledger on its first CUDA use, "
             "all done in under 1 s in total (the best-known interposer spends about 300 ms per "
             "process, one at a time: about 77 s for 256).", "",
             f"Method: `bench/spawn_many.c` starts {processes} copies of `bench/first_use.c` at once "
             "(posix_spawn) and times from the first start to the last exit; each copy does its "
             "first CUDA use (`cuInit`, primary context, one 1 MiB allocation, its free). Without "
             "the shim it runs against the simulator alone (fresh shared state file); with it, as "
             f"`gpuvisor exec --simulate {SIM_SPEC} --mem {BUDGET} -- spawn_many {processes} first_use`, "
             "where every process maps the ledger, claims a slot and charges its allocation. "
             f"Interleaved, {repetitions} repetitions; medians.", "",
             "| measure | without shim | with shim | added by shim | ratio |", "|---|---|---|---|---|",
             f"| {processes} processes, first start to last exit | {ms_cell(seconds['direct'])} | {ms_cell(seconds['shim'])} | "
             f"{(shim - direct) * 1e3:,.0f} ms | {shim / direct:.2f}x |",
             f"| per process (÷ {processes}) | {direct / processes * 1e3:.2f} ms | {shim / processes * 1e3:.2f} ms | "
             f"{(shim - direct) / processes * 1e3:.2f} ms | |",
             f"| whole `gpuvisor exec` (ledger, sampler, summary included) | | {ms_cell(seconds['exec'])} | | |",
             *([f"| instructions of one `first_use` process (callgrind, loader included) | {per_process['direct']:,} | "
                f"{per_process['shim']:,} | {per_process['shim'] - per_process['direct']:,} | "
                f"{per_process['shim'] / per_process['direct']:.2f}x |"] if per_process else []),
             "",
             "Times: median (interquartile range). The instruction count is for one process run "
             "alone, from its first instruction (dynamic loading of the shim included) to its exit: "
             "what registration costs, free of scheduling noise.",
             "",
             (f"Every run with the shim had all {processes} processes" if min(registered) == processes else
              f"Runs with the shim had only {min(registered)} to {max(registered)} of {processes} processes")
             + " in the ledger holding their 1 MiB, as read by `gpuvisor exec --json`'s summary "
             "(short-lived processes are seen because the ledger keeps their peaks).", ""]
    verdict = "within" if shim < 1.0 else "OVER"
    noise = max(high - low for low, high in (quartiles(seconds["direct"]), quartiles(seconds["shim"])))
    if abs(shim - direct) <= noise:
        share = "starting the processes dominates, and the shim's share is within run-to-run noise"
    else:
        share = f"the shim adds {(shim - direct) / processes * 1e3:.2f} ms per process"
    lines += [f"Reading: {processes} processes start, register and finish in {shim * 1e3:,.0f} ms with the shim, "
              f"{verdict} the 1 s target, against {direct * 1e3:,.0f} ms without it: {share}."]
    return lines


SECTIONS = {
    "planner": section_planner,
    "explain": section_explain,
    "shim-alloc": section_shim_alloc,
    "shim-startup": section_shim_startup,
    # Log throughput against supervisord and honcho, start-up of 256 replicas.
    "supervisor": lambda args: __import__("bench_supervisor").section(args),
    # Supervisor CPU and RSS with 256 replicas sampled every 100 ms.
    "sampler": lambda args: __import__("bench_sampler").section(args),
    # What the head, the agents and the preflight add to starting a job (stand-in srun).
    "cluster": lambda args: __import__("bench_cluster").section(args),
    # Refused allocations with 16 to 1,024 processes sharing one budget.
    "refusals": lambda args: __import__("bench_refusals").section(args),
    # Peak of a torch training step: gpuvisor's dry run, torch's MemTracker, FakeGPU ($FAKEGPU_DIR).
    "dryrun": lambda args: __import__("bench_dryrun").section(args),
    # gpuvisor.current() per call from Python (the ledger read by python/gpuvisor).
    "python": lambda args: __import__("bench_python").section(args),
    # A sweep of 100 jobs on 2 simulated GPUs: gpuvisor's queue against one job per GPU
    # (simple_gpu_scheduler), slots per GPU and free-memory polling.
    "queue": lambda args: __import__("bench_queue").section(args),
    # Start-up, supervisor CPU and RSS, ps, metrics and top with 64, 256 and 1,024 replicas.
    "scale": lambda args: __import__("bench_scale").section(args),
}


def load_average():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (for a smoke run)")
    parser.add_argument("--only", nargs="*", choices=sorted(SECTIONS), help="run only these sections")
    parser.add_argument("--output", type=Path, default=DOC, help="where to write (default docs/benchmarks.md)")
    parser.add_argument("--charts-only", action="store_true",
                        help="measure nothing: redraw every chart from the tables already in the page")
    args = parser.parse_args()
    if args.charts_only:
        for path in redraw(args.output):
            print(f"bench: wrote {path}", file=sys.stderr)
        print(f"bench: embedded the charts in {args.output}", file=sys.stderr)
        return
    chosen = args.only or list(SECTIONS)
    load_before = load_average()
    body, chart_errors, sections = [], [], []
    try:
        for name in chosen:
            print(f"bench: {name} ...", file=sys.stderr)
            lines = SECTIONS[name](args)
            try:
                lines = with_chart(name, lines, args.output)
            except ValueError as error:  # ChartError, or a value render() cannot draw
                # Keep the measurements: the table is written, the failure reported at the end.
                chart_errors.append(f"{name}: {error}")
            body += lines + [""]
            sections.append(lines)
    finally:
        if Tools._built:
            Tools._built.cleanup()
    if args.only and args.output.exists():
        # Some sections: each replaces its own `## heading` in the page; the rest stays as it was.
        for lines in sections:
            replace_section(lines[0].removeprefix("## ").strip(), "\n".join(lines).rstrip(), args.output)
        print(f"bench: replaced {', '.join(chosen)} in {args.output}", file=sys.stderr)
        report_chart_errors(chart_errors)
        return
    rustc = sh(["rustc", "--version"]).stdout.strip()
    command = "python3 scripts/bench.py" + (" --quick" if args.quick else "") + \
        (" --only " + " ".join(args.only) if args.only else "")
    header = [
        "# Benchmarks", "",
        "<!-- Generated by scripts/bench.py; edit the script, not this file. -->", "",
        f"Generated by `{command}` on {datetime.date.today()}. To regenerate: `python3 scripts/bench.py` "
        "(all sections, a few minutes; `--quick` for a smoke run, `--only SECTION...` for some).", "",
        "Each section's chart (`docs/benchmarks/SECTION.svg`, shown after its table) is drawn from the figures "
        "of that table; `python3 scripts/bench.py --charts-only` redraws them all from this page without "
        "measuring anything.", "",
        f"Machine: {machine()}; {rustc}; load average {load_before} at the start and "
        f"{load_average()} at the end (other work shares this machine: absolute times are "
        "pessimistic and noisy).", "",
        "Comparisons are measured side by side in the same run, interleaved; read the ratios and "
        "the added costs, not the absolute times.", "",
    ]
    args.output.write_text("\n".join(header + body).rstrip() + "\n")
    print(f"bench: wrote {args.output}", file=sys.stderr)
    report_chart_errors(chart_errors)


def report_chart_errors(chart_errors):
    if chart_errors:
        sys.exit("bench: no chart for " + "; ".join(chart_errors) +
                 "\nhint: make bench_section_charts.py read the new table, then run "
                 "`python3 scripts/bench.py --charts-only`")


if __name__ == "__main__":
    main()
