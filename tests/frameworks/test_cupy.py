"""The real CuPy (cupy-cuda12x 14.2: cudart and NVRTC 12.9) on gpuvisor's simulator, under a
per-process budget: its memory pool against the budget, and an NVRTC-compiled kernel."""

import sys
import unittest

from fwtest import GIB, MIB, FrameworkTest, gib

BUDGET = 4 * GIB
SIMULATE = ["--simulate", "1x16GiB", "--mem-per-process", "4GiB"]
CHUNK_MIB = 512


class CupyTest(FrameworkTest):
    framework = "cupy"
    venv = "jax"
    timeout = 180

    def cupy_run(self):
        return self.shared_run("cupy", lambda: self.exec_worker(
            "cupy_worker.py", ["--chunk-mib", str(CHUNK_MIB)], SIMULATE,
            env={"CUDA_VISIBLE_DEVICES": None}, expect_status=None))

    def test_elementwise_kernel(self):
        """An elementwise kernel, compiled by NVRTC in the process, is loaded and launched."""
        r = self.cupy_run().result()
        self.assertEqual(r["mem_total"], BUDGET, "cudaMemGetInfo total is not the budget")
        self.assertTrue(r.get("elementwise_kernel_ran"), "the elementwise kernel did not run")

    def test_pool_up_to_the_budget(self):
        """The pool allocates up to the budget and raises OutOfMemoryError past it."""
        run = self.cupy_run()
        self.assert_status(run)
        r = run.result()
        filled = r["filled_bytes"]
        self.assertEqual(r["fill_error"], "cupy.cuda.memory.OutOfMemoryError")
        self.assertLessEqual(filled, BUDGET)
        self.assertGreaterEqual(filled, BUDGET - 2 * CHUNK_MIB * MIB)
        self.assertEqual(r["too_big_error"], "cupy.cuda.memory.OutOfMemoryError")
        peak = run.peak(r["pid"])
        denials = run.denials_of(r["pid"])
        sys.stderr.write(f"\n  filled {gib(filled)} of {gib(BUDGET)}, ledger peak {gib(peak)}, "
                         f"{len(denials)} denial(s) ")
        self.assertGreaterEqual(peak, filled)
        self.assertLessEqual(peak, BUDGET)
        self.assertTrue(denials, "no denial recorded for the refused allocations")


if __name__ == "__main__":
    unittest.main()
