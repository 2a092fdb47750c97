"""The product's scenarios (shared/docs/product.md) with the real libraries on the simulator:
S1 three JAX trainings by joblib on one card, S2 a torch trainer's CPU-only collectors, S3 a JAX
learner, torch actors and a plain CUDA simulator process under `gpuvisor run`."""

import json
import sys
import unittest

import re

from fwtest import GIB, REPO, FrameworkTest, events, gib, venv_python
from test_jax import on_cuda

OUT_OF_MEMORY = re.compile(r"out of memory|RESOURCE_EXHAUSTED|OUT_OF_MEMORY", re.IGNORECASE)
# Neither the caller's framework settings nor its device selection leak into the scenarios.
CLEAN = {"XLA_PYTHON_CLIENT_PREALLOCATE": None, "XLA_PYTHON_CLIENT_MEM_FRACTION": None,
         "XLA_CLIENT_MEM_FRACTION": None, "JAX_PLATFORMS": None, "CUDA_VISIBLE_DEVICES": None,
         "PYTORCH_CUDA_ALLOC_CONF": None, "PYTORCH_ALLOC_CONF": None}


class S1JoblibJax(FrameworkTest):
    """S1: three JAX trainings started by joblib on one simulated 40 GiB card."""

    venv = "jax"
    timeout = 420

    def tasks(self, run):
        r = run.result()
        return [r.get(f"task{i}", {"ok": False, "error": "no result"}) for i in range(3)]

    def test_without_budgets_the_second_preallocation_fails(self):
        """Without budgets each JAX process preallocates 75% of 40 GiB: the second one's
        preallocation is refused out of memory, and not all three trainings finish (the field
        report). XLA then backs off (0.9 of the size each try) to what is left: the second gets
        8.5 GiB, the third 0.5 GiB, and the third's 2 GiB of data does not fit."""
        workdir = self.tmp / "s1"
        workdir.mkdir()
        run = self.exec_worker("s1_parallel.py", [str(workdir)], ["--simulate", "1x40GiB"],
                               env=CLEAN, expect_status=None)
        tasks = self.tasks(run)
        for task in tasks:
            sys.stderr.write(f"\n  task {task.get('task', '?')} (pid {task.get('pid')}): "
                             f"{'ok' if task.get('ok') else task.get('error', '')[:160]}; "
                             f"{task.get('memory_stats')} ")
        self.assertTrue(tasks[0].get("ok"), f"the first training failed: {tasks[0]}")
        self.assertEqual(tasks[0].get("bytes_limit"), int(0.75 * 40 * GIB))
        # The tasks start JAX one after the other: the second finds 30 of the 40 GiB taken.
        second = tasks[1]
        refused = [line for line in run.stderr.splitlines()
                   if f" {second.get('pid')} " in line and "out of memory" in line
                   and "Failed to allocate device memory of 30.00GiB" in line]
        pool = (second.get("memory_stats") or {}).get("pool_bytes")
        self.assertTrue(refused or (pool is not None and pool < 30 * GIB),
                        f"the second process's 30 GiB preallocation was not refused: {second}")
        failed = [t for t in tasks[1:] if not t.get("ok")]
        self.assertTrue(failed, "all three trainings finished without budgets")
        for task in failed:
            self.assertRegex(task.get("error", ""), OUT_OF_MEMORY,
                             f"task {task.get('task')} failed, but not out of memory")

    def test_with_budgets_all_three_finish(self):
        """Under `gpuvisor exec --mem-per-process 12GiB` all three finish, each with a pool of
        75% of its 12 GiB."""
        workdir = self.tmp / "s1"
        workdir.mkdir()
        run = self.exec_worker("s1_parallel.py", [str(workdir)],
                               ["--simulate", "1x40GiB", "--mem-per-process", "12GiB"], env=CLEAN)
        for task in self.tasks(run):
            self.assertTrue(task.get("ok"), f"task {task.get('task')} failed: {task}")
            self.assertTrue(task.get("device", "").startswith("CudaDevice"), f"{task}")
            self.assertEqual(task.get("bytes_limit"), int(0.75 * 12 * GIB))
            peak = run.peak(task["pid"])
            sys.stderr.write(f"\n  task {task['task']}: pid {task['pid']}, ledger peak {gib(peak)} ")
            self.assertLessEqual(peak, 12 * GIB)
        self.assertEqual(run.summary["denials_total"], 0)


class S2CpuOnlyCollectors(FrameworkTest):
    """S2: a torch trainer whose collectors (forked and spawned) touch CUDA while CPU-only."""

    venv = "torch"
    timeout = 300

    def test_collectors_refused_and_listed_trainer_unaffected(self):
        workdir = self.tmp / "s2"
        workdir.mkdir()
        run = self.exec_worker("s2_trainer.py", [str(workdir)],
                               ["--simulate", "h100", "--mem-per-process", "8GiB",
                                "--children-cpu-only"], env=CLEAN)
        r = run.result()
        self.assertEqual(r["trainer_mem_total"], 8 * GIB)
        self.assertEqual(r["trainer_steps"], 10)
        trainer = run.process(r["trainer_pid"])
        self.assertFalse(trainer["cpu_only_violation"], "the trainer was counted as a violation")
        self.assertGreater(trainer["peak_bytes"][0], 0, "the trainer's GPU use is not in the ledger")
        listed = {p["pid"] for p in run.summary["processes"] if p["cpu_only_violation"]}
        for collector in r["collectors"]:
            sys.stderr.write(f"\n  collector {collector['index']} ({collector.get('start_method')}, "
                             f"pid {collector.get('pid')}): {collector['outcome']} "
                             f"{collector.get('error', '')[:100]} ")
            self.assertEqual(collector["outcome"], "refused", f"collector {collector}")
            self.assertIn(collector["pid"], listed,
                          f"collector {collector['index']} is not listed as a CPU-only violation")
        self.assertEqual(listed, {c["pid"] for c in r["collectors"]},
                         "processes other than the collectors were listed")

    def test_job_file_children_cpu_only(self):
        """The same trainer as a job-file process with `children_cpu_only = true` and
        `on_gpu_use = "warn"` under `gpuvisor run`: a `violation` event per collector."""
        workdir = self.tmp / "s2"
        workdir.mkdir()
        job = f"""
[job]
name = "frameworks-s2"

[process.trainer]
command = [{json.dumps(self.python)}, {json.dumps(str(REPO / "tests" / "frameworks" / "s2_trainer.py"))}, {json.dumps(str(workdir))}]
framework = "torch"
memory = "8GiB"
children_cpu_only = true
on_gpu_use = "warn"
"""
        run = self.run_job(job, ["--simulate", "h100"])
        self.assert_status(run)
        plan = json.loads((run.run_dir / "plan.json").read_text())
        budget = plan["replicas"][0]["budget_bytes"]
        r = run.result(text=run.log("trainer"), who="the trainer")
        self.assertEqual(r["trainer_mem_total"], budget)
        self.assertEqual(r["trainer_steps"], 10)
        violations = {e["pid"] for e in events(run.run_dir) if e["kind"] == "violation"}
        for collector in r["collectors"]:
            self.assertEqual(collector["outcome"], "refused", f"collector {collector}")
            self.assertIn(collector["pid"], violations,
                          f"collector {collector['index']} has no `violation` event")
        self.assertNotIn(r["trainer_pid"], violations, "the trainer was counted as a violation")


class S3LearnerActorsSimulator(FrameworkTest):
    """S3: a JAX learner (30%), three torch actors (10% each) and a plain CUDA simulator process
    (the rest) under `gpuvisor run` on one simulated 80 GiB card."""

    timeout = 480

    def test_learner_actors_simulator(self):
        jax_python = venv_python(self, "jax")
        torch_python = venv_python(self, "torch")
        here = REPO / "tests" / "frameworks"
        job = f"""
[job]
name = "frameworks-s3"

[process.sim]
command = ["python3", {json.dumps(str(REPO / "examples" / "cuda_alloc.py"))}, "--mib", "4096", "--steps", "4"]
framework = "cuda"
memory = "rest"

[process.learner]
command = [{json.dumps(jax_python)}, {json.dumps(str(here / "jax_worker.py"))}, "train", "--steps", "3"]
framework = "jax"
memory = "30%"

[process.actor]
command = [{json.dumps(torch_python)}, {json.dumps(str(here / "torch_worker.py"))}, "mlp", "--steps", "5"]
replicas = 3
framework = "torch"
memory = "10%"
after = ["learner"]
"""
        run = self.run_job(job, ["--simulate", "1x80GiB"])
        self.assert_status(run)
        plan = json.loads((run.run_dir / "plan.json").read_text())
        budgets = {(r["process"], r["replica"]): r["budget_bytes"] for r in plan["replicas"]}
        exits = {e["process"]: e for e in events(run.run_dir) if e["kind"] == "exit"}
        for label in ["sim", "learner", "actor[0]", "actor[1]", "actor[2]"]:
            self.assertIn(label, exits, f"{label} never exited")
            self.assertEqual(exits[label].get("code"), 0, f"{label}: {exits[label]}")
        denials = [e for e in events(run.run_dir) if e["kind"] == "denial"]
        self.assertEqual(denials, [], "allocations were refused")

        learner = run.result(text=run.log("learner"), who="the learner")
        budget = budgets[("learner", 0)]
        fraction = float(learner["mem_fraction"])
        sys.stderr.write(f"\n  learner: budget {gib(budget)}, XLA fraction {fraction}, "
                         f"bytes_limit {gib(learner['bytes_limit'] or 0)} ")
        self.assertTrue(on_cuda(learner), f"the learner's jax.devices() = {learner['devices']}")
        self.assertAlmostEqual(learner["bytes_limit"], int(fraction * budget), delta=2 << 20)
        self.assertEqual(learner.get("train_steps"), 3)
        for replica in range(3):
            actor = run.result(text=run.log(f"actor.{replica}"), who=f"actor {replica}")
            budget = budgets[("actor", replica)]
            sys.stderr.write(f"\n  actor {replica}: budget {gib(budget)}, sees "
                             f"{gib(actor['mem_get_info_total'])}, max_memory_reserved "
                             f"{gib(actor['max_memory_reserved'])} ")
            self.assertEqual(actor["mem_get_info_total"], budget)
            self.assertEqual(actor["steps"], 5)
        sim_log = run.log("sim")
        budget = budgets[("sim", 0)]
        self.assertIn(f"device: {budget / GIB:.2f} GiB total", sim_log)


if __name__ == "__main__":
    unittest.main()
