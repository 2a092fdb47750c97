"""Scenario S1 (../../docs product brief): three JAX trainings started by joblib on one GPU,
written as users write it: joblib.Parallel(n_jobs=3) over a training function.

    python s1_parallel.py WORKDIR

Each training keeps 2 GiB of data on the device. Two things are added for a deterministic test,
neither touching memory: the three tasks first
wait until all three run (so they are three processes), then start JAX one after the other (so
"the second process" is well defined), and each writes its outcome to WORKDIR/outcome-I.json
before returning (so a worker that dies still leaves a record). JAX_PLATFORMS=cuda makes a failed
GPU start an error instead of a silent fall-back to the CPU. Prints `RESULT {json}` per task.
"""

import json
import os
import sys
import time
from pathlib import Path

import fwversions

TASKS = 3
WAIT_S = 240
WORKING_SET_BYTES = 2 << 30


def wait_for(predicate, what):
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {WAIT_S} s for {what}")
        time.sleep(0.05)


def train(index, workdir):
    workdir = Path(workdir)
    (workdir / f"started-{index}").write_text(str(os.getpid()))
    wait_for(lambda: len(list(workdir.glob("started-*"))) == TASKS, "all tasks to start")
    if index > 0:
        wait_for(lambda: (workdir / f"outcome-{index - 1}.json").exists(),
                 f"task {index - 1} to start JAX")
    outcome = {"task": index, "pid": os.getpid()}
    (workdir / f"outcome-{index}.json.tmp").write_text(json.dumps({**outcome, "ok": None}))
    os.environ["JAX_PLATFORMS"] = "cuda"
    try:
        import jax
        import jax.numpy as jnp

        device = jax.devices()[0]
        outcome["device"] = repr(device)
        outcome["bytes_limit"] = (device.memory_stats() or {}).get("bytes_limit")

        @jax.jit
        def step(w, x):
            loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
            return loss, w - 0.01 * grad

        # The training's data lives on the device (a 2 GiB buffer, as a replay buffer or a
        # dataset would): a training needs memory beyond what the pool holds at start.
        data = jnp.zeros((WORKING_SET_BYTES // 4,), jnp.float32)
        w = jnp.ones((256, 256))
        for i in range(2):
            x = jax.lax.dynamic_slice(data, (i * 64 * 256,), (64 * 256,)).reshape(64, 256)
            loss, w = step(w, x)
        loss.block_until_ready()
        outcome["ok"] = True
    except Exception as error:  # the field report's failure: reported, not raised
        outcome["ok"] = False
        outcome["error"] = f"{type(error).__name__}: {error}"[:2000]
        print(f"task {index}: {outcome['error']}", file=sys.stderr, flush=True)
    try:  # the pool XLA got (pool_bytes) against the one it wanted (bytes_limit)
        stats = jax.devices()[0].memory_stats() or {}
        outcome["memory_stats"] = {k: stats[k] for k in ("bytes_limit", "pool_bytes",
                                                         "peak_pool_bytes", "bytes_reserved",
                                                         "peak_bytes_in_use") if k in stats}
    except Exception:
        pass
    (workdir / f"outcome-{index}.json").write_text(json.dumps(outcome))
    return outcome


def main():
    workdir = sys.argv[1]
    fwversions.report("jax")
    fwversions.report("joblib")
    import joblib

    try:
        joblib.Parallel(n_jobs=TASKS)(joblib.delayed(train)(i, workdir) for i in range(TASKS))
    except Exception as error:  # a worker that died: its outcome file says how far it got
        print(f"joblib: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
    for index in range(TASKS):
        path = Path(workdir) / f"outcome-{index}.json"
        if path.exists():
            outcome = json.loads(path.read_text())
        elif (Path(workdir) / f"outcome-{index}.json.tmp").exists():
            outcome = {"task": index, "ok": False, "error": "the worker died starting JAX"}
        else:
            outcome = {"task": index, "ok": False, "error": "never started JAX"}
        print("RESULT " + json.dumps({f"task{index}": outcome}), flush=True)


if __name__ == "__main__":
    main()
