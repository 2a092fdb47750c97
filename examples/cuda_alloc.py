"""Allocate GPU memory through the CUDA driver API with ctypes: a stand-in for a training
process that needs no framework, so gpuvisor's budgets can be watched anywhere — on a real GPU,
or under `--simulate` (gpuvisor then puts its GPU simulator first on the library path).

    python3 cuda_alloc.py --mib 256 --steps 4

Prints the device size the process sees (its budget under gpuvisor), then allocates --steps
blocks of --mib MiB, stopping at the first refusal. Exit status 0 if every block fit, 3 if one was
refused (CUDA_ERROR_OUT_OF_MEMORY; 0 with --refusal-ok), 1 if CUDA itself is unusable.
"""
import argparse
import ctypes
import sys

OUT_OF_MEMORY = 2


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of each block in MiB")
    parser.add_argument("--steps", type=int, default=4, help="how many blocks to allocate")
    parser.add_argument("--refusal-ok", action="store_true", help="exit 0 when a block is refused")
    args = parser.parse_args()
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        sys.exit(f"cuda_alloc: no CUDA driver ({error})")

    def call(name, *arguments):
        return getattr(cuda, name)(*arguments)

    device, context = ctypes.c_int(), ctypes.c_void_p()
    for name, arguments in [("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(device), 0)),
                            ("cuDevicePrimaryCtxRetain", (ctypes.byref(context), device)),
                            ("cuCtxSetCurrent", (context,))]:
        rc = call(name, *arguments)
        if rc != 0:
            print(f"cuda_alloc: {name} failed with CUresult {rc}", file=sys.stderr)
            return 1
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
    print(f"device: {total.value / 2**30:.2f} GiB total, {free.value / 2**30:.2f} GiB free")
    pointer = ctypes.c_uint64()
    for step in range(1, args.steps + 1):
        rc = call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(args.mib << 20))
        if rc == OUT_OF_MEMORY:
            print(f"block {step} of {args.mib} MiB refused: out of memory after {(step - 1) * args.mib} MiB")
            return 0 if args.refusal_ok else 3
        if rc != 0:
            print(f"cuda_alloc: cuMemAlloc_v2 failed with CUresult {rc}", file=sys.stderr)
            return 1
        print(f"block {step}: {step * args.mib} MiB allocated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
