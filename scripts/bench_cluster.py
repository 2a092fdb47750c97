#!/usr/bin/env python3
"""Multi-node start-up: what the head, the agents and the preflight add to starting a job.

Usage: bench_cluster.py [--quick] [--write]

The same job runs two ways, side by side, in one run: on one machine (`gpuvisor run --local`)
and as a multi-node run of N nodes (`gpuvisor run` in a pretend Slurm allocation whose srun is
the stand-in of crates/gpuvisor-cli/tests/fixtures/fake-srun: one agent per "node", the nodes
being loopback addresses 127.0.0.1..N, all on this machine). Per node: one replica of a
`distributed` learner world (so there is a coordinator to probe) and 4 CPU-only workers; the
one-machine run has as many replicas. Measured from the command's start to (a) the `preflight`
event (every agent connected, planned, and probed every coordinator) and (b) the last replica's
`start` event. Every agent and replica shares this machine's cores, so larger N also measures
contention that a real cluster spreads over its nodes.
"""
import argparse
import calendar
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE_SRUN = ROOT / "crates/gpuvisor-cli/tests/fixtures/fake-srun"
HEADING = "Multi-node start-up"


def stamp_seconds(line):
    stamp = line.split('"t":"')[1].split('"')[0]
    return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + float(stamp[19:23])


def job_text(nodes):
    return ("[cluster]\npreflight_timeout = \"60s\"\n\n"
            "[process.learner]\ncommand = [\"sleep\", \"60\"]\ndevice = \"cpu\"\ndistributed = true\n"
            + (f"replicas = {nodes}\n" if nodes > 1 else "")
            + "\n[process.worker]\ncommand = [\"sleep\", \"60\"]\ndevice = \"cpu\"\n"
            + "replicas = 4\n")


def one_start(binary, work, nodes, multi, attempt):
    """Seconds from start to the preflight event (None on one machine) and to the last start."""
    run_dir = work / f"{'multi' if multi else 'local'}-{nodes}-{attempt}"
    job = work / f"job-{nodes}-{'m' if multi else 'l'}.toml"
    # One machine: the same replica count (learner x nodes, worker x 4*nodes).
    job.write_text(job_text(nodes) if not multi else job_text(1))
    if not multi:
        job.write_text(job_text(nodes).replace("replicas = 4", f"replicas = {4 * nodes}"))
    env = dict(os.environ)
    for name in list(env):
        if name.startswith("SLURM") or name.startswith("GPUVISOR_"):
            del env[name]
    argv = [str(binary), "run", str(job), "--quiet", "--run-dir", str(run_dir)]
    if multi:
        bin_dir = work / "bin"
        bin_dir.mkdir(exist_ok=True)
        shutil.copy(FAKE_SRUN, bin_dir / "srun")
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
        env["SLURM_JOB_ID"] = "1"
        env["SLURM_JOB_NODELIST"] = ",".join(f"127.0.0.{i + 1}" for i in range(nodes))
        env["GPUVISOR_HEAD_ADDRESS"] = "127.0.0.1"
    else:
        argv.append("--local")
    replicas = 5 * nodes
    started = time.time()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events = run_dir / "events.jsonl"
    preflight = last = None
    deadline = time.time() + 120
    while time.time() < deadline:
        lines = events.read_text().splitlines() if events.exists() else []
        starts = [line for line in lines if '"kind":"start"' in line]
        flights = [line for line in lines if '"kind":"preflight"' in line]
        if flights:
            preflight = flights[0]
        if len(starts) >= replicas:
            last = starts[-1]
            break
        time.sleep(0.05)
    subprocess.run([str(binary), "stop", str(run_dir)], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)
    process.wait(timeout=120)
    if last is None:
        sys.exit(f"bench: {replicas} replicas over {nodes} node(s) did not all start within 120 s")
    return (stamp_seconds(preflight) - started if preflight else None, stamp_seconds(last) - started)


def ms(seconds):
    return f"{seconds * 1000:.0f} ms"


def section(args):
    from bench import build, load_average, machine  # here: bench.py imports this file

    binary = build()
    rounds = 3 if args.quick else 5
    sizes = [1, 4, 8]
    rows = []
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="gpuvisor-bench-cluster-") as tmp:
        work = Path(tmp)
        for nodes in sizes:
            local, multi, flight = [], [], []
            for attempt in range(rounds):
                # Alternated, so drift in the machine's load hits both alike.
                local.append(one_start(binary, work, nodes, False, attempt)[1])
                preflight, last = one_start(binary, work, nodes, True, attempt)
                flight.append(preflight)
                multi.append(last)
            rows.append((nodes, statistics.median(local), statistics.median(flight),
                         statistics.median(multi), min(multi), max(multi)))
            print(f"bench: cluster {nodes} node(s) done", file=sys.stderr)
    lines = [f"## {HEADING}", "",
             f"Command: `python3 scripts/bench_cluster.py --write` ({rounds} runs per size, alternating; "
             f"load average {load_before} when it started; {machine()}).", "",
             "| nodes | replicas | one machine: all started | multi-node: preflight done | multi-node: all started (min–max) | multi-node / one machine |",
             "|---|---|---|---|---|---|"]
    for nodes, local, flight, multi, low, high in rows:
        lines.append(f"| {nodes} | {5 * nodes} | {ms(local)} | {ms(flight)} | {ms(multi)} ({ms(low)}–{ms(high)}) | "
                     f"{multi / local:.2f}x |")
    lines += ["",
              "Medians, from `gpuvisor run` starting to the event in `events.jsonl`. Multi-node runs go "
              "through the stand-in srun (crates/gpuvisor-cli/tests/fixtures/fake-srun): one agent per "
              "node, all on this machine, nodes being loopback addresses; each agent connects to the "
              "head, plans its node, holds its coordinator port, and every agent probes every "
              "coordinator before any replica starts. A real srun adds its own step launch (under "
              "0.1 s for 3 nodes on the test cluster, docs/slurm-tests.md). The one-machine run starts "
              "the same replicas (the learner world on one machine) with `--local`."]
    return lines


def main():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 runs per size instead of 5")
    parser.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    args = parser.parse_args()
    lines = section(args)
    print("\n".join(lines))
    if args.write:
        from bench import DOC, replace_section
        from bench_section_charts import with_chart

        replace_section(HEADING, "\n".join(with_chart("cluster", lines, DOC)))


if __name__ == "__main__":
    main()
