"""CuPy checks, run by test_cupy.py in the jax venv (cupy-cuda12x) under gpuvisor's simulator.

    python cupy_worker.py --chunk-mib 512

memGetInfo; the memory pool filled up to the budget, then OutOfMemoryError; one array larger
than the budget refused; an elementwise kernel (compiled by NVRTC at run time) launched.
Reports `RESULT {json}` lines on stdout. Device memory holds no data on the simulator.
"""

import argparse
import json
import os
import sys

import fwversions

MIB = 1 << 20


def result(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-mib", type=int, default=512)
    args = parser.parse_args()
    fwversions.report("cupy")
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    result(pid=os.getpid(), mem_free=free, mem_total=total,
           device_count=cupy.cuda.runtime.getDeviceCount())

    # An elementwise kernel: CuPy generates CUDA C, NVRTC compiles it, the driver loads and
    # launches it.
    x = cupy.ones(1 << 20, dtype=cupy.float32)
    y = x * 2 + 1
    squared_diff = cupy.ElementwiseKernel("float32 a, float32 b", "float32 c",
                                          "c = (a - b) * (a - b)", "gpuvisor_squared_diff")
    z = squared_diff(x, y)
    cupy.cuda.Device().synchronize()
    result(elementwise_kernel_ran=True, kernel_result_shape=list(z.shape))
    del x, y, z

    # The pool allocates up to the budget, then refuses.
    pool = cupy.get_default_memory_pool()
    chunk = args.chunk_mib * MIB
    held, error = [], None
    while len(held) * chunk <= total + chunk:
        try:
            held.append(cupy.empty(chunk, dtype=cupy.uint8))
        except cupy.cuda.memory.OutOfMemoryError as oom:
            error = oom
            break
    result(filled_bytes=len(held) * chunk, pool_total_bytes=pool.total_bytes(),
           fill_error=f"{type(error).__module__}.{type(error).__name__}" if error else None,
           fill_message=str(error)[:300] if error else None)
    del held
    pool.free_all_blocks()

    try:
        cupy.empty(total + (1 << 30), dtype=cupy.uint8)
        result(too_big_error=None)
    except cupy.cuda.memory.OutOfMemoryError as oom:
        result(too_big_error=f"{type(oom).__module__}.{type(oom).__name__}")
    result(done=True)


if __name__ == "__main__":
    sys.exit(main())
