"""nvitop, gpustat and pynvml (PyPI, unmodified) beside `gpuvisor top --once` on one simulated
run: the simulator's NVML stand-in serves them all, and they report the same used memory for the
same process. (docs/top.md, "Other tools on the simulator", shows their output.)
"""

import json
import re
import sys
import unittest
from pathlib import Path

from fwtest import GIB, HERE, MIB, FrameworkTest

HOLD_MIB = 3072
CONTEXT_MIB = 300  # GPUVISOR_SIM_CONTEXT_OVERHEAD, set below: what NVML adds per context
SIMULATE = ["--simulate", "1x24GiB", "--mem-per-process", "8GiB"]


class NvmlToolsTest(FrameworkTest):
    venv = "tools"
    timeout = 180

    def test_tools_agree_on_one_process(self):
        """The three tools and pynvml see the holder with the same bytes: its allocation plus its
        context, as the card would; gpuvisor's ledger charges the allocation alone."""
        tools_bin = str(Path(self.python).parent)
        run = self.exec_worker("nvml_tools_worker.py",
                               ["observe", "--tools-bin", tools_bin, "--gpuvisor", self.bin,
                                "--mib", str(HOLD_MIB)],
                               SIMULATE, python=sys.executable,
                               env={"GPUVISOR_SIM_CONTEXT_OVERHEAD": f"{CONTEXT_MIB}MiB"})
        r = run.result()
        pid = r["holder_pid"]
        for name in ("nvitop", "gpustat", "gpustat_json", "pynvml", "top"):
            self.assertEqual(r[name]["status"], 0, f"{name} failed:\n{r[name]['stderr']}")

        nvml = json.loads(r["pynvml"]["stdout"])
        used = nvml["processes"].get(str(pid))
        self.assertIsNotNone(used, f"pynvml does not list the holder {pid}: {nvml}")
        self.assertEqual(used, (HOLD_MIB + CONTEXT_MIB) * MIB,
                         "NVML's used memory is not the allocation plus the context")
        self.assertEqual(run.peak(pid), HOLD_MIB * MIB, "the ledger's peak is not the allocation")
        used_mib = used // MIB

        # nvitop -1: the process table's row of the pid, `GPU-MEM` in MiB.
        row = [line for line in r["nvitop"]["stdout"].splitlines() if re.search(rf"\s{pid}\s", line)]
        self.assertTrue(row, f"nvitop -1 has no row for pid {pid}")
        self.assertIn(f"{used_mib}MiB", row[0], f"nvitop's row for {pid}: {row[0]!r}")

        # gpustat: --json per process (MiB), and the one-line form's `user(NNNNM)`.
        gpus = json.loads(r["gpustat_json"]["stdout"])["gpus"]
        by_pid = {p["pid"]: p["gpu_memory_usage"] for p in gpus[0]["processes"]}
        self.assertEqual(by_pid.get(pid), used_mib, f"gpustat --json: {by_pid}")
        self.assertIn(f"({used_mib}M)", r["gpustat"]["stdout"])

        # gpuvisor top --once (the machine view, NVML): the pid's row in GiB to one decimal.
        row = [line for line in r["top"]["stdout"].splitlines() if re.search(rf"\s{pid}\s", line)]
        self.assertTrue(row, f"gpuvisor top --once has no row for pid {pid}")
        self.assertIn(f"{used / GIB:.1f}G", row[0], f"gpuvisor top's row for {pid}: {row[0]!r}")
        sys.stderr.write(f"\n  pid {pid}: NVML {used_mib} MiB in pynvml, nvitop, gpustat and top "
                         f"({used / GIB:.1f}G); ledger {HOLD_MIB} MiB ")


if __name__ == "__main__":
    unittest.main()
