"""Multi-GPU checks on the simulator, run by test_multigpu.py: real NCCL under JAX and torch.

    python multigpu_worker.py jax       # one process, every visible GPU: pmap psum, then a
                                        # data+tensor-parallel jitted grad step on a 4x2 mesh
    python multigpu_worker.py torch     # one rank of `torchrun`: all_reduce, barrier,
                                        # all_gather over NCCL (collective timeout:
                                        # $MULTIGPU_TIMEOUT_SECONDS, default 300)

Reports `RESULT {json}` lines. Collectives complete without moving data (kernels are no-ops),
so nothing here looks at values.
"""

import json
import os
import sys

import fwversions


def result(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def jax_checks():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devices = jax.devices()
    result(pid=os.getpid(), devices=[repr(d) for d in devices],
           bytes_limits=[(d.memory_stats() or {}).get("bytes_limit") for d in devices])
    summed = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(jnp.arange(float(len(devices))))
    summed.block_until_ready()
    result(psum=list(summed.shape))
    mesh = Mesh(np.array(devices).reshape(len(devices) // 2, 2), ("data", "model"))
    weights = jax.device_put(jnp.ones((256, 256)), NamedSharding(mesh, P(None, "model")))
    batch = jax.device_put(jnp.ones((64, 256)), NamedSharding(mesh, P("data", None)))

    @jax.jit
    def step(w, x):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
        return w - 0.1 * grad, loss

    weights, loss = step(weights, batch)
    loss.block_until_ready()
    result(sharded_step=True)


def torch_checks():
    import datetime

    import torch
    import torch.distributed as dist

    # A short collective timeout, so a stalled collective trips ProcessGroupNCCL's watchdog in
    # seconds (test_multigpu's stall test); healthy runs never come near it.
    timeout = float(os.environ.get("MULTIGPU_TIMEOUT_SECONDS", "300"))
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=timeout))
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    tensor = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(tensor)
    dist.barrier()
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor)
    torch.cuda.synchronize()
    result(pid=os.getpid(), rank=rank, world=dist.get_world_size(),
           device=torch.cuda.current_device(), collectives=True)
    dist.destroy_process_group()


def main():
    check = sys.argv[1]
    fwversions.report(check)
    {"jax": jax_checks, "torch": torch_checks}[check]()


if __name__ == "__main__":
    sys.exit(main())
