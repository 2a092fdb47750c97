"""Scenario S2: a torch trainer whose collector workers touch CUDA although they must stay on
the CPU (TorchRL's collectors call torch.cuda.synchronize() through tensordict's _sync_all).

    python s2_trainer.py WORKDIR

Two collectors are forked before the trainer starts CUDA, two are spawned after (the two ways
multiprocessing starts them); each calls torch.cuda.synchronize() and records what happened in
WORKDIR/collector-I.json. The trainer trains meanwhile. Prints `RESULT {json}` lines.
"""

import json
import multiprocessing
import os
import sys
from pathlib import Path

import fwversions


def collector(index, start_method, workdir):
    import torch

    record = {"index": index, "start_method": start_method, "pid": os.getpid()}
    try:
        torch.cuda.synchronize()
        record["outcome"] = "used CUDA"
    except Exception as error:
        record["outcome"] = "refused"
        record["error"] = f"{type(error).__name__}: {error}"[:300]
    (Path(workdir) / f"collector-{index}.json").write_text(json.dumps(record))


def main():
    workdir = sys.argv[1]
    fwversions.report("torch")
    import torch

    workers = []
    fork = multiprocessing.get_context("fork")
    for index in (0, 1):  # forked before this process starts CUDA, as torch requires
        workers.append(fork.Process(target=collector, args=(index, "fork", workdir)))
        workers[-1].start()

    free, total = torch.cuda.mem_get_info()
    print("RESULT " + json.dumps({"trainer_pid": os.getpid(), "trainer_mem_total": total}),
          flush=True)
    spawn = multiprocessing.get_context("spawn")
    for index in (2, 3):
        workers.append(spawn.Process(target=collector, args=(index, "spawn", workdir)))
        workers[-1].start()

    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 4)).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    steps = 0
    for _ in range(10):
        loss = model(torch.randn(32, 128, device="cuda")).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
    torch.cuda.synchronize()
    for worker in workers:
        worker.join(timeout=120)
    collectors = []
    for index in range(len(workers)):
        path = Path(workdir) / f"collector-{index}.json"
        collectors.append(json.loads(path.read_text()) if path.exists()
                          else {"index": index, "outcome": "no record",
                                "exitcode": workers[index].exitcode})
    print("RESULT " + json.dumps({"trainer_steps": steps, "collectors": collectors}), flush=True)


if __name__ == "__main__":
    main()
