"""Scenario S3 of scripts/gpu-validate.py: a learner (JAX, 30%), 3 actors (PyTorch, 10% each) and a
simulator (plain CUDA, the rest) on one GPU under `gpuvisor run`, with a job file written here.

Checks: all run; each process's environment is the plan's; each sees its budget as the device
(JAX's pool limit, torch.cuda.mem_get_info, cuMemGetInfo); one actor that allocates past its
budget is refused while the others go on; `gpuvisor ps` and the samples show peaks <= budgets.
"""

import json
import os
import signal
import subprocess
import time

from gv_common import (GIB, env_problems, framework_env_ok, gib, plan_expectations, read_events,
                       s3_job_toml, sample_peaks, table, tail, update_peaks)
from gv_scenarios import read_json

GREEDY_REPLICA = 1
ROLES = ("sim", "learner", "actor[0]", "actor[1]", "actor[2]")


def number(value):
    return "%.4g" % value if isinstance(value, (int, float)) else "-"


def s3(ctx):
    work = os.path.join(ctx.work, "s3")
    out_dir, run_dir, job_path = os.path.join(work, "out"), os.path.join(work, "run"), os.path.join(work, "job.toml")
    os.makedirs(out_dir)
    backends = {"sim": "ctypes", "learner": "ctypes", "actor": "ctypes"} if ctx.simulate else \
        {"sim": "cuda", "learner": "jax", "actor": "torch"}
    job_text = s3_job_toml(ctx.gpu, ctx.worker, out_dir, GREEDY_REPLICA, ctx.options.s3_seconds, backends)
    with open(job_path, "w") as out:
        out.write(job_text)
    plan_command = [ctx.gpuvisor, "plan", job_path, "--json"] + ctx.sim_args()
    run_command = [ctx.gpuvisor, "run", job_path, "--run-dir", run_dir, "--quiet"] + ctx.sim_args()
    if ctx.dry_run:
        print("# S3 job file (%s):\n%s" % (ctx.show([job_path]), ctx.show([job_text])), flush=True)
        for command in (plan_command, run_command, [ctx.gpuvisor, "ps", run_dir, "--json"]):
            print("$ " + ctx.show(command), flush=True)
        ctx.row("S3 learner / actors / simulator", run_command, "-", "-", None)
        return

    planned = subprocess.run(plan_command, capture_output=True, text=True, timeout=60)
    if planned.returncode != 0:
        ctx.row("S3 plan", plan_command, "the job plans", tail(planned.stderr), False)
        return
    expected = plan_expectations(json.loads(planned.stdout))

    peaks, polls, started = {}, 0, time.time()
    with open(os.path.join(work, "run.out"), "w") as output:
        supervisor = subprocess.Popen(run_command, env=ctx.clean_env(), stdout=output, stderr=subprocess.STDOUT)
        while supervisor.poll() is None:
            if time.time() - started > ctx.timeout:
                supervisor.send_signal(signal.SIGINT)  # the job stops as on Ctrl-C
                try:
                    supervisor.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    supervisor.kill()
                break
            ps = subprocess.run([ctx.gpuvisor, "ps", run_dir, "--json"], capture_output=True, text=True, timeout=30)
            if ps.returncode == 0:
                try:
                    update_peaks(peaks, json.loads(ps.stdout))
                    polls += 1
                except ValueError:
                    pass
            time.sleep(0.5)
        supervisor.wait()
    seconds = time.time() - started
    with open(os.path.join(work, "run.out")) as handle:
        run_output = handle.read()

    results = {label: read_json(os.path.join(out_dir, label + ".json")) or {} for label in ROLES}
    try:
        with open(os.path.join(run_dir, "events.jsonl")) as handle:
            events = read_events(handle)
    except OSError:
        events = []
    header = read_json(os.path.join(run_dir, "samples", "header.json")) or {}
    try:
        with open(os.path.join(run_dir, "samples", "full.jsonl")) as handle:
            samples = sample_peaks(header, handle)
    except OSError:
        samples = {}
    logs = {}
    for label in ROLES:
        try:
            with open(os.path.join(run_dir, "logs", label + ".log"), errors="replace") as handle:
                logs[label] = handle.read().splitlines()[-30:]
        except OSError:
            logs[label] = None
    ctx.raw["S3"] = {"results": results, "expected": expected, "ps_peaks": peaks, "sample_peaks": samples,
                     "events": events, "exit": supervisor.returncode, "run_output": run_output[-4000:],
                     "log_tails": logs}
    check_s3(ctx, run_command, supervisor.returncode, seconds, run_output, expected, results, events, peaks,
             samples, polls)


def check_s3(ctx, command, code, seconds, run_output, expected, results, events, peaks, samples, polls):
    """The S3 rows and figures from what the run left (split from s3() so each part stays short)."""
    greedy = "actor[%d]" % GREEDY_REPLICA
    # 1. All run.
    failed = ["%s (%s)" % (label, results[label].get("error") or "no result") for label in ROLES
              if not results[label].get("ok")]
    platforms = {label: results[label].get("platform") for label in ROLES}
    off_gpu = [label for label in ("learner", "actor[0]", "actor[1]", "actor[2]")
               if not ctx.simulate and platforms[label] != "gpu"]
    learner = results["learner"]
    trained = learner.get("backend") != "jax" or (learner.get("loss_last") or 1e9) < (learner.get("loss_first") or 0)
    ctx.row("S3 all run", command,
            "5 replicas run together and end well (the learner's loss falls); `gpuvisor run` exits 0",
            "exit %s after %.0f s; %s%s; %s"
            % (code, seconds, "failed: " + ", ".join(failed) if failed else "all 5 ok",
               "; not on the GPU: %s" % off_gpu if off_gpu else "",
               "learner loss %s -> %s" % (number(learner.get("loss_first")), number(learner.get("loss_last")))
               if learner.get("backend") == "jax" else "learner: driver-API stand-in (no training)")
            + ("" if code == 0 else "; " + tail(run_output)),
            code == 0 and not failed and not off_gpu and trained)

    # 2. Environment per framework, read inside each process.
    problems = {}
    for label in ROLES:
        plan = expected.get(label, {})
        if not results[label]:
            problems[label] = ["no result"]
            continue
        found = env_problems(plan.get("env", {}), results[label].get("env", {}), plan.get("framework"))
        if not framework_env_ok(label, results[label].get("env", {})):
            found.append("framework settings missing or wrong")
        if found:
            problems[label] = found
    learner_env = results["learner"].get("env", {})
    actor_env = results["actor[0]"].get("env", {})
    ctx.row("S3 framework env", command,
            "each process's env = its plan (JAX fraction, PyTorch allocator conf, none for the simulator), "
            "shim preloaded",
            "; ".join("%s: %s" % (label, ", ".join(found)) for label, found in problems.items()) or
            "all as planned: learner XLA_PYTHON_CLIENT_MEM_FRACTION=%s PREALLOCATE=%s; actors PYTORCH_ALLOC_CONF=%s; "
            "sim no framework variables" % (learner_env.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
                                            learner_env.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
                                            actor_env.get("PYTORCH_ALLOC_CONF")),
            not problems)

    # 3. The budget is the device each one sees.
    seen, wrong = [], []
    for label in ROLES:
        result, budget = results[label], expected.get(label, {}).get("budget")
        if not result or budget is None:
            wrong.append(label)
            continue
        if label == "learner" and result.get("backend") == "jax":
            limit = result.get("bytes_limit") or 0
            fraction = float(result.get("env", {}).get("XLA_PYTHON_CLIENT_MEM_FRACTION") or 0)
            seen.append("learner bytes_limit %s (fraction %.4f x budget %s = %s)"
                        % (gib(limit), fraction, gib(budget), gib(fraction * budget)))
            if not (limit <= budget and abs(limit - fraction * budget) <= 0.02 * budget):
                wrong.append(label)
        else:
            total = result.get("device_total")
            seen.append("%s total %s (budget %s)" % (label, gib(total), gib(budget)))
            if total != budget:
                wrong.append(label)
    ctx.row("S3 budget as device total", command,
            "JAX pool limit = fraction x budget; torch.cuda.mem_get_info / cuMemGetInfo total = budget",
            "; ".join(seen) + ("; wrong: %s" % wrong if wrong else ""), not wrong)

    # 4. One actor allocates past its budget: refused; the others go on.
    oom = results[greedy].get("oom") or {}
    budget = expected.get(greedy, {}).get("budget") or 0
    allocated = oom.get("allocated", 0)
    slack = min(2 * GIB, budget // 2)
    denials = [event for event in events if event.get("kind") == "denial" and event.get("process") == greedy]
    other_denials = [event for event in events if event.get("kind") == "denial" and event.get("process") != greedy]
    went_on = {label: results[label].get("steps_after_oom", 0) for label in ROLES if label != greedy}
    # The refusal is at the replica's own budget (the ledger's limit), not at the card's end.
    limits = sorted({event.get("limit_bytes") for event in denials})
    passed = (oom.get("is_out_of_memory_error") and budget - slack <= allocated <= budget and bool(denials)
              and limits == [budget] and not other_denials and all(steps >= 20 for steps in went_on.values())
              and results[greedy].get("all_ready"))
    ctx.row("S3 refusal stays in one actor", command,
            "%s: out-of-memory error after %s-%s; a denial event names it, at its budget; the 4 others keep "
            "stepping" % (greedy, gib(budget - slack), gib(budget)),
            "%s: %s after %s (all running: %s); denial events: %d for it (limit %s), %d for others; steps after: %s"
            % (greedy, oom.get("error"), gib(allocated), results[greedy].get("all_ready"), len(denials),
               ", ".join(gib(limit) for limit in limits if limit is not None) or "-", len(other_denials),
               ", ".join("%s %d" % item for item in went_on.items())),
            bool(passed))

    # 5. Peaks within budgets, as gpuvisor ps (and the samples) show them.
    over, shown = [], []
    for label in ROLES:
        budget = expected.get(label, {}).get("budget")
        ps_peak = peaks.get(label, (None, None))[0]
        ledger_peak = (samples.get(label) or {}).get("ledger")
        peak = max(value for value in (ps_peak, ledger_peak, 0) if value is not None)
        shown.append("%s %s / %s" % (label, gib(peak), gib(budget)))
        if budget is None or peak > budget or peak == 0:
            over.append(label)
    ctx.row("S3 peaks within budgets", [ctx.gpuvisor, "ps", "RUN", "--json"],
            "every replica's ledger peak (gpuvisor ps, polled %d times; samples) is > 0 and <= its budget" % polls,
            "; ".join(shown) + ("; over or missing: %s" % over if over else ""), not over)

    figures = []
    for label in ROLES:
        result, plan = results[label], expected.get(label, {})
        sees = result.get("bytes_limit") if label == "learner" and result.get("backend") == "jax" else \
            result.get("device_total")
        figures.append((label, result.get("backend", "-"), gib(plan.get("budget")), gib(sees),
                        gib(peaks.get(label, (None,))[0]), gib((samples.get(label) or {}).get("nvml")),
                        result.get("steps", "-"), result.get("steps_after_oom", "-"),
                        "%.0f s" % result["seconds"] if "seconds" in result else "-"))
    ctx.sections.append(("S3: per replica", table(
        ("replica", "runs", "budget", "sees (pool limit / device total)", "peak (gpuvisor ps)",
         "peak (NVML, with context)", "steps", "steps after the refusal", "ran"), figures)))
