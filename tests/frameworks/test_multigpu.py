"""Multi-GPU jobs with the real NCCL on gpuvisor's simulator: JAX on 8 simulated GPUs in one
process (NCCL 2.32 through XLA) and torch under `torchrun` with 2 ranks (NCCL 2.30), each GPU
with its own budget. The simulator's NVML answers peer-to-peer status for every pair, and its
VMM and pointer attributes are what NCCL's buffer registration asks. Collectives complete
without moving data (kernels are no-ops): docs/simulator.md says what that rules out."""

import json
import sys
import unittest
from pathlib import Path

from fwtest import GIB, HERE, FrameworkTest, gib

GPUS = 8
BUDGET = 2 * GIB
# Small simulated GPUs: XLA keeps 8 bytes of host memory per 256 bytes of its pool, per GPU.
JAX_ARGS = ["--simulate", f"{GPUS}x4GiB", "--gpu", ",".join(map(str, range(GPUS))),
            "--mem-per-process", "2GiB"]
TORCH_ARGS = ["--simulate", "2x8GiB", "--gpu", "0,1", "--mem-per-process", "4GiB"]
# Neither a stall nor XLA flags set by the caller reach the runs.
CLEAN = {"GPUVISOR_SIM_STALL": None, "XLA_PYTHON_CLIENT_PREALLOCATE": None,
         "XLA_PYTHON_CLIENT_MEM_FRACTION": None,
         "XLA_CLIENT_MEM_FRACTION": None, "JAX_PLATFORMS": None, "CUDA_VISIBLE_DEVICES": None,
         "NCCL_CUMEM_HOST_ENABLE": None}


class JaxEightGpus(FrameworkTest):
    framework = "jax"
    venv = "jax"
    timeout = 300

    def test_collectives_and_a_sharded_step_within_per_gpu_budgets(self):
        """pmap psum over 8 GPUs and a data+tensor-parallel grad step (mesh 4x2); every GPU
        preallocates 75% of its budget and no GPU goes past it."""
        run = self.exec_worker("multigpu_worker.py", ["jax"], JAX_ARGS, env=CLEAN)
        r = run.result()
        self.assertEqual(len(r["devices"]), GPUS, f"jax.devices() = {r['devices']}")
        self.assertTrue(all(d.startswith("CudaDevice") for d in r["devices"]), r["devices"])
        self.assertEqual(r["bytes_limits"], [int(0.75 * BUDGET)] * GPUS)
        self.assertEqual(r["psum"], [GPUS])
        self.assertTrue(r["sharded_step"])
        peaks = [run.peak(r["pid"], device) for device in range(GPUS)]
        sys.stderr.write(f"\n  ledger peaks per GPU: {', '.join(gib(p) for p in peaks)} ")
        for device, peak in enumerate(peaks):
            self.assertGreaterEqual(peak, int(0.75 * BUDGET), f"GPU {device} shows no pool")
            self.assertLessEqual(peak, BUDGET, f"GPU {device} went past its budget")
        self.assertFalse(run.denials_of(r["pid"]), "a GPU refused memory")


class TorchrunTwoRanks(FrameworkTest):
    framework = "torch"
    venv = "torch"
    timeout = 300

    def torchrun(self, env=None):
        torchrun = str(Path(self.python).parent / "torchrun")
        argv = [self.bin, "exec", "--json", *TORCH_ARGS, "--", torchrun, "--nproc_per_node",
                "2", str(HERE / "multigpu_worker.py"), "torch"]
        return self.command(argv, env=env)

    def test_a_stalled_all_reduce_trips_the_watchdog(self):
        """GPUVISOR_SIM_STALL makes rank 1's first NCCL all-reduce kernel (on GPU 1) hang, as
        a stuck collective does on hardware: ProcessGroupNCCL's watchdog reports the timed-out
        collective on rank 1 while rank 0 goes on; the stall ends after its time limit and the
        job exits."""
        run = self.torchrun(env={"GPUVISOR_SIM_STALL": "AllReduce@1",
                                 "GPUVISOR_SIM_STALL_SECONDS": "12",
                                 "MULTIGPU_TIMEOUT_SECONDS": "4"})
        self.assertIn("gpuvisor-sim: stalling `", run.stderr)
        self.assertIn("ncclDevKernel_AllReduce", run.stderr)
        self.assertRegex(run.stderr, r"\[rank1\].*Operation timed out after \d+ ms",
                         "ProcessGroupNCCL's watchdog did not report rank 1's collective")
        self.assertNotRegex(run.stderr, r"\[rank0\].*Operation timed out",
                            "rank 0, whose all-reduce was not stalled, timed out")

    def test_nccl_collectives_on_two_ranks(self):
        """`torchrun --nproc_per_node 2`: init_process_group(nccl), all_reduce, barrier,
        all_gather, destroy_process_group; each rank on its own GPU within its budget."""
        run = self.torchrun(env={"GPUVISOR_SIM_STALL": None})
        self.assert_status(run)
        ranks = sorted(run.results(), key=lambda r: r.get("rank", -1))
        ranks = [r for r in ranks if r.get("collectives")]
        self.assertEqual([(r["rank"], r["device"]) for r in ranks], [(0, 0), (1, 1)],
                         f"ranks reported: {ranks}")
        # The ranks' stderr shares gpuvisor's: its summary is the last `{"command": ...}` object.
        start = run.stderr.rfind('{"command"')
        self.assertGreaterEqual(start, 0, "gpuvisor exec --json printed no summary")
        run.summary, _ = json.JSONDecoder().raw_decode(run.stderr[start:])
        for r in ranks:
            peak = run.peak(r["pid"], r["device"])
            sys.stderr.write(f"\n  rank {r['rank']}: ledger peak {gib(peak)} on GPU {r['device']} ")
            self.assertGreater(peak, 0)
            self.assertLessEqual(peak, 4 * GIB)
        self.assertEqual(run.summary["denials_total"], 0)


if __name__ == "__main__":
    unittest.main()
