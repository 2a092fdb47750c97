"""A jax.distributed worker for the Slurm tests: joins the job, all-gathers one value per process
on CPU, and prints one JSON line:

    {"process_id": 1, "num_processes": 3, "host": "n2", "mode": "explicit",
     "gathered": [0, 101, 202], "seconds": 0.8}

Process i contributes i * 101, so a correct run gathers [i * 101 for i in range(num_processes)]
in every process. Exit status 0 means initialize and the all-gather both returned.

How it joins (--mode):
  explicit  jax.distributed.initialize(coordinator_address=, num_processes=, process_id=) with
            the values of --coordinator/--num-processes/--process-id, else of the environment's
            JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID (default mode).
  slurm     explicit too, but computed from Slurm's environment here: the coordinator is the first
            host of SLURM_STEP_NODELIST at --port, process_id = SLURM_PROCID, num_processes =
            SLURM_NTASKS (one process per task).
  auto      plain jax.distributed.initialize(): jax's own Slurm detection.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time


def first_step_host() -> str:
    nodelist = os.environ["SLURM_STEP_NODELIST"]
    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True
    ).stdout.split()
    return hosts[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["explicit", "slurm", "auto"], default="explicit")
    parser.add_argument("--coordinator", default=os.environ.get("JAX_COORDINATOR_ADDRESS"))
    parser.add_argument("--num-processes", type=int, default=os.environ.get("JAX_NUM_PROCESSES"))
    parser.add_argument("--process-id", type=int, default=os.environ.get("JAX_PROCESS_ID"))
    parser.add_argument("--port", type=int, default=29517, help="coordinator port (--mode slurm)")
    parser.add_argument("--timeout", type=int, default=60, help="initialize timeout, seconds")
    args = parser.parse_args()

    # CPU only, and gloo for cross-process CPU collectives (without it a multi-process CPU
    # computation fails to compile or runs process-locally, depending on the jax version).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    jax.config.update("jax_cpu_collectives_implementation", "gloo")

    started = time.monotonic()
    if args.mode == "auto":
        jax.distributed.initialize(initialization_timeout=args.timeout)
    else:
        if args.mode == "slurm":
            args.coordinator = f"{first_step_host()}:{args.port}"
            args.process_id = int(os.environ["SLURM_PROCID"])
            args.num_processes = int(os.environ["SLURM_NTASKS"])
        missing = [
            name
            for name, value in [
                ("--coordinator/JAX_COORDINATOR_ADDRESS", args.coordinator),
                ("--num-processes/JAX_NUM_PROCESSES", args.num_processes),
                ("--process-id/JAX_PROCESS_ID", args.process_id),
            ]
            if value is None
        ]
        if missing:
            print(f"allgather.py: missing {', '.join(missing)}", file=sys.stderr)
            return 2
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=int(args.num_processes),
            process_id=int(args.process_id),
            initialization_timeout=args.timeout,
        )

    process_id = jax.process_index()
    gathered = multihost_utils.process_allgather(np.array([process_id * 101], dtype=np.int32))
    record = {
        "process_id": process_id,
        "num_processes": jax.process_count(),
        "host": socket.gethostname(),
        "mode": args.mode,
        "gathered": [int(value) for value in np.asarray(gathered).reshape(-1)],
        "seconds": round(time.monotonic() - started, 3),
    }
    # One write of the whole line (under PIPE_BUF): processes sharing srun's pipe cannot
    # interleave inside it.
    sys.stdout.flush()
    os.write(1, (json.dumps(record) + "\n").encode())
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
