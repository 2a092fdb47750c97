"""nvitop, gpustat, pynvml and `gpuvisor top --once` on one simulated run (test_nvml_tools.py).

    gpuvisor exec --simulate 1x24GiB --mem-per-process 8GiB -- \
        python3 nvml_tools_worker.py observe --tools-bin VENV/bin --gpuvisor BIN --mib 3072

`observe` starts a holder (this file, `hold MIB`: the CUDA driver through ctypes, one block of MIB
MiB, held until its stdin closes), then runs each tool once inside the same gpuvisor tree, so
every tool loads the simulator's NVML (libnvidia-ml.so.1 beside libcuda.so.1 on LD_LIBRARY_PATH)
over the same simulated machine (GPUVISOR_SIM_STATE), and prints `RESULT {json}`: the holder's
pid and each tool's output. Standard library only (the tools run from their own venv).
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

MIB = 1 << 20
# pynvml's view: every compute process of GPU 0 with its used memory (bytes).
PYNVML = """
import json, pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
processes = {str(p.pid): p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
print(json.dumps({"used": memory.used, "total": memory.total, "processes": processes}))
"""


def hold(mib):
    cuda = ctypes.CDLL("libcuda.so.1")
    device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    for name, arguments in [("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(device), 0)),
                            ("cuDevicePrimaryCtxRetain", (ctypes.byref(context), device)),
                            ("cuCtxSetCurrent", (context,)),
                            ("cuMemAlloc_v2", (ctypes.byref(pointer), ctypes.c_size_t(mib * MIB)))]:
        rc = getattr(cuda, name)(*arguments)
        if rc != 0:
            sys.exit(f"nvml_tools_worker: {name} failed with CUresult {rc}")
    print("HELD " + json.dumps({"pid": os.getpid(), "mib": mib}), flush=True)
    sys.stdin.read()  # until the observer closes it


def tool(argv, env):
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=env,
                          stdin=subprocess.DEVNULL, timeout=120)
    return {"argv": argv, "status": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-4000:],
            "seconds": round(time.monotonic() - started, 2)}


def observe(args):
    holder = subprocess.Popen([sys.executable, os.path.abspath(__file__), "hold", str(args.mib)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline()
        if not line.startswith("HELD "):
            sys.exit(f"nvml_tools_worker: the holder printed {line!r} (status {holder.wait()})")
        held = json.loads(line[len("HELD "):])
        # A fixed terminal size, no colours: the outputs go into docs/top.md as they are.
        env = dict(os.environ, COLUMNS="120", LINES="40", NO_COLOR="1", TERM="dumb")
        tools_bin = args.tools_bin
        result = {"holder_pid": held["pid"], "mib": held["mib"],
                  "nvitop": tool([os.path.join(tools_bin, "nvitop"), "-1"], env),
                  "gpustat": tool([os.path.join(tools_bin, "gpustat"), "--no-color"], env),
                  "gpustat_json": tool([os.path.join(tools_bin, "gpustat"), "--json"], env),
                  "pynvml": tool([os.path.join(tools_bin, "python"), "-c", PYNVML], env),
                  "top": tool([args.gpuvisor, "top", "--once"], env)}
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    hold_parser = sub.add_parser("hold", help="allocate MIB MiB through the driver and hold it")
    hold_parser.add_argument("mib", type=int)
    observe_parser = sub.add_parser("observe", help="hold memory, run the tools, print RESULT")
    observe_parser.add_argument("--tools-bin", required=True, help="bin/ of the tools venv")
    observe_parser.add_argument("--gpuvisor", required=True, help="the gpuvisor binary")
    observe_parser.add_argument("--mib", type=int, default=3072)
    args = parser.parse_args()
    if args.mode == "hold":
        hold(args.mib)
    else:
        observe(args)


if __name__ == "__main__":
    main()
