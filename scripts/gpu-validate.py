#!/usr/bin/env python3
"""Validate gpuvisor on a real NVIDIA GPU and write the results as a markdown report.

Usage:
  python3 scripts/gpu-validate.py docs/validation/<gpu>.md [--only S3,OVERHEAD,THROUGHPUT]
          [--gpuvisor PATH] [--gpu N] [--timeout SECONDS] [--raw results.json]
  python3 scripts/gpu-validate.py --dry-run [--only ...]      print the commands, run nothing
  python3 scripts/gpu-validate.py REPORT.md --simulate 1x80GiB
          check the script itself on gpuvisor's simulated GPU (no hardware result)

Needs Python with JAX (CUDA), PyTorch (CUDA) and joblib, a built `gpuvisor` (--gpuvisor, on PATH,
or target/release|debug/gpuvisor: `cargo build --release` first), and no internet. OVERHEAD uses
gcc when there is one (else ctypes) and libcudart from the torch / nvidia-* pip packages when
found. Every scenario runs this same file in a worker mode (`--worker MODE`), with and without
gpuvisor; the whole run takes about 5 minutes. Exit status 0 only if every check passed.

Scenarios (--only takes a comma-separated list; default all):
  S1          three JAX processes with default settings, started by joblib, each allocating half
              of its budget: all succeed under `exec --mem-per-process B`; without gpuvisor at
              least one fails (the first takes 75% of the card). S1b: JAX's bytes_limit <= B.
  T1          torch inside an 8 GiB budget: torch.cuda.mem_get_info() total = 8 GiB and
              torch.OutOfMemoryError at the budget, with and without expandable segments.
  S2          a torch trainer with --children-cpu-only: its 4 spawned workers that touch CUDA
              are refused a context and listed by pid.
  S3          `gpuvisor run` of a job file written here: learner (JAX, 30%, trains an MLP),
              3 actors (PyTorch, 10% each, inference loop), simulator (plain CUDA via ctypes,
              the rest). Each process's env is its plan's; each sees its budget as the device;
              one actor allocating past its budget is refused while the others keep stepping;
              `gpuvisor ps` / the samples show every peak <= its budget.
  OVERHEAD    ns per cuMemAlloc_v2 + cuMemFree_v2 pair (and cudaMalloc + cudaFree when libcudart
              is found), 1 MiB, in a tight loop (alloc_pairs.c, or ctypes without gcc), without
              gpuvisor and under `gpuvisor exec --mem-per-process` (the shim), alternated.
  THROUGHPUT  steps/s of a small JAX and a small PyTorch MLP, without gpuvisor and under
              `gpuvisor exec`, both processes started once and measured in turns A/B/A/B.

Helper modules and the C program live in scripts/gpu-validate/; their pure parts are tested by
scripts/test_gpu_validate.py. docs/validation/README.md explains the report.
"""

import datetime
import json
import os
import shutil
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "gpu-validate"))

from gv_common import GIB, cell, parse_options, render_report  # noqa: E402


def find_gpuvisor(explicit, dry_run):
    candidates = [explicit] if explicit else []
    candidates.append(shutil.which("gpuvisor"))
    root = os.path.dirname(HERE)
    candidates += [os.path.join(root, "target", kind, "gpuvisor") for kind in ("release", "debug")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    if dry_run:
        return "gpuvisor"
    sys.exit("gpu-validate: no gpuvisor binary found\n  hint: build it (cargo build --release) or pass --gpuvisor")


def inventory(gpuvisor, options):
    """(gpu dict, driver version) from `gpuvisor gpus --json`; a stand-in 80 GiB GPU in a dry run."""
    command = [gpuvisor, "gpus", "--json"] + (["--simulate", options.simulate] if options.simulate else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        data = json.loads(done.stdout)
        gpu = next(item for item in data["gpus"] if item["index"] == options.gpu)
        return gpu, data.get("driver_version")
    except (OSError, ValueError, KeyError, StopIteration, subprocess.TimeoutExpired):
        if options.dry_run:
            return {"index": options.gpu, "name": "(unknown: dry run)", "total_bytes": 80 * GIB}, None
        sys.exit("gpu-validate: `%s` found no GPU %d\n  hint: check the driver (nvidia-smi) or --gpu; "
                 "--simulate 1x80GiB checks the script on a machine without a GPU"
                 % (" ".join(command), options.gpu))


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--worker":
        import gv_workers
        return gv_workers.main(sys.argv[2:])

    options = parse_options(sys.argv[1:])
    import gv_scenarios
    import gv_s3
    functions = {"S1": gv_scenarios.s1, "T1": gv_scenarios.t1, "S2": gv_scenarios.s2, "S3": gv_s3.s3,
                 "OVERHEAD": gv_scenarios.overhead, "THROUGHPUT": gv_scenarios.throughput}
    gpuvisor = find_gpuvisor(options.gpuvisor, options.dry_run)
    gpu, driver = inventory(gpuvisor, options)
    ctx = gv_scenarios.Context(options, gpuvisor, os.path.abspath(__file__), gpu["total_bytes"])
    started = datetime.datetime.now(datetime.timezone.utc)
    versions = {} if options.dry_run else (ctx.run(ctx.worker + ["versions"], ctx.clean_env())["result"] or {})
    try:
        version = subprocess.run([gpuvisor, "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        version = "gpuvisor (not found)"

    for name in options.scenarios:
        print("gpu-validate: %s ..." % name, file=sys.stderr, flush=True)
        try:
            functions[name](ctx)
        except Exception:  # noqa: BLE001 - one broken scenario must not lose the others' results
            ctx.row(name, "-", "the scenario runs", "script error: " + cell(traceback.format_exc(limit=3)[-600:]), False)

    title = []
    if options.simulate:
        title += ["**Simulated GPU (`--simulate %s`): this checks the script and gpuvisor's orchestration "
                  "on the stand-in driver, not hardware behaviour.**" % options.simulate, ""]
    title += ["- date: %s (%.0f s)" % (started.strftime("%Y-%m-%d %H:%M UTC"),
                                       (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()),
              "- %s" % version,
              "- GPU %d: %s, %.1f GiB; driver %s" % (gpu["index"], gpu.get("name"), gpu["total_bytes"] / GIB, driver),
              "- %s" % (", ".join("%s %s" % (name, value) for name, value in versions.items() if name != "cudart")
                        or "versions: not asked in a dry run"),
              "- libcudart: %s" % versions.get("cudart"),
              "- command: `python3 scripts/gpu-validate.py %s`" % " ".join(sys.argv[1:])]
    report = render_report(title, ctx.rows, ctx.sections)
    if options.dry_run:
        print("\n# dry run: the report would start like this\n" + report)
        shutil.rmtree(ctx.work, ignore_errors=True)
        return 0
    directory = os.path.dirname(os.path.abspath(options.report))
    os.makedirs(directory, exist_ok=True)
    with open(options.report, "w") as out:
        out.write(report)
    if options.raw:
        with open(options.raw, "w") as out:
            json.dump(ctx.raw, out, indent=1, default=str)
    print(report)
    passed = bool(ctx.rows) and all(row["verdict"] in ("PASS", "SKIP") for row in ctx.rows)
    if passed:
        shutil.rmtree(ctx.work, ignore_errors=True)
    else:
        print("gpu-validate: some checks failed; the work files (S3 run directory, logs) are kept in %s" % ctx.work,
              file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
