#!/usr/bin/env python3
"""Memory dry runs compared: the peak of a torch training step as gpuvisor's simulator, PyTorch's
own CPU-side estimator and FakeGPU predict it, for the same models.

Usage: python3 scripts/bench_dryrun.py [--quick] [--write] [--torch-python PY] [--fakegpu DIR]
       [--models NAME ...]
       python3 scripts/bench.py --only dryrun   (FakeGPU from $FAKEGPU_DIR)

Prints the "## Memory dry runs: predicted peaks" section of docs/benchmarks.md (and replaces that
section in the file with --write). scripts/bench.py runs it too, as its `dryrun` section.

Every model is built in code with random weights (nothing is downloaded) and trained for STEPS
steps (forward, loss, backward, Adam step, zero_grad; the second step is the steady state, where
Adam's state exists while the gradients are made). The same worker (this file, `--worker`) runs:

  (a) gpuvisor: `gpuvisor exec --simulate h100 --mem-per-process 64GiB --json -- PY THIS --worker
      MODEL cuda` (80GiB is refused: the simulated H100 has 79.6 GiB): the real torch 2.15 wheel and its caching allocator, cuBLAS and cuDNN on the
      simulator. Reported: the ledger's peak for the process (`peak_bytes` of the summary: torch's
      pool plus the workspaces the CUDA libraries allocate themselves) and torch's own
      max_memory_reserved() / max_memory_allocated() as printed by the worker.
  (b) torch's MemTracker (torch.distributed._tools.mem_tracker), as its docstring shows it, with
      the model, optimizer and batch on the "meta" device (no kernel runs, no device is needed;
      FakeTensorMode on "cuda" needs a GPU for backward, see the worker): the peak of the tensors it
      tracks, reset_mod_stats() between steps.
  (c) FakeGPU's preflight (github.com/FanBB2333/FakeGPU), `python -m fakegpu preflight --runtime
      fakecuda --profile h100 -- PY THIS --worker MODEL cuda`, from the checkout given with
      --fakegpu DIR or $FAKEGPU_DIR (not part of gpuvisor; "skipped: ..." without it): its tracked
      requested and reserved peaks (its allocator model). This runtime needs no build; when DIR/build
      holds FakeGPU's CMake build (`cmake -S . -B build && cmake --build build`), its native runtime
      (its own libcuda/libcudart/libnccl under the real torch wheel) is tried on the first model too.
      The first model also runs made under `with torch.device("cuda")` (FakeGPU and gpuvisor), since
      FakeGPU does not track parameters made that way.

Each gpuvisor dry run is made twice (once with --quick) to show it gives the same bytes.

The torch venv is tests/frameworks/venv.sh torch unless --torch-python names one; the gpuvisor binary
is $GPUVISOR_BIN or target/debug/gpuvisor (built with cargo when missing). Standard library only
outside the worker.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve()
HEADING = "Memory dry runs: predicted peaks"
MIB = 1 << 20
STEPS = 2
# The held-out model: chosen and sized before any figure was seen, and never tuned to.
HELD_OUT = "recsys"

# name -> (description, what it is built from)
MODELS = {
    "mlp": "MLP 1024-4096-4096-4096-1000, batch 512 (42 M parameters)",
    "resnet": "ResNet-18 layout (BasicBlocks 64-128-256-512, BatchNorm), batch 32 of 3x128x128, 100 classes",
    "transformer": "nn.TransformerEncoder, 6 layers, d_model 512, 8 heads, ffn 2048; "
                   "embedding + LM head over 8,000 tokens, batch 8 x 256 tokens",
    "recsys": "held out: two 500,000 x 64 nn.Embedding tables + MLP 128-1024-1024-1, batch 4,096",
}


# ----------------------------------------------------------------------------------------------
# The worker: runs in the torch venv (under gpuvisor, under FakeGPU, or alone for MemTracker).


def build_model(name, torch, device):
    """(model, loss function). On "cuda" the usual idiom: the model is made on the CPU and moved
    with `.to("cuda")`, the batch made on the device. On "meta" everything is made on the device
    directly (moving parameters between devices is refused there)."""
    if device == "meta":
        with torch.device(device):
            return _build_model(name, torch, device)
    return _build_model(name, torch, device, move=True)


def _build_model(name, torch, device, move=False):
    nn = torch.nn
    if name == "mlp":
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                              nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1000))
        model = model.to(device) if move else model
        x = torch.randn(512, 1024, device=device)
        y = torch.randint(0, 1000, (512,), device=device)
        return model, lambda: nn.functional.cross_entropy(model(x), y)
    if name == "resnet":
        class Block(nn.Module):
            def __init__(self, cin, cout, stride):
                super().__init__()
                self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(cout)
                self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(cout)
                self.down = None
                if stride != 1 or cin != cout:
                    self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

            def forward(self, x):
                out = torch.relu(self.bn1(self.conv1(x)))
                out = self.bn2(self.conv2(out))
                return torch.relu(out + (x if self.down is None else self.down(x)))

        layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
            cin = cout
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 100)]
        model = nn.Sequential(*layers)
        model = model.to(device) if move else model
        x = torch.randn(32, 3, 128, 128, device=device)
        y = torch.randint(0, 100, (32,), device=device)
        return model, lambda: nn.functional.cross_entropy(model(x), y)
    if name == "transformer":
        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(8000, 512)
                layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
                self.encoder = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
                self.head = nn.Linear(512, 8000)

            def forward(self, tokens):
                return self.head(self.encoder(self.embed(tokens)))

        model = LM().to(device) if move else LM()
        tokens = torch.randint(0, 8000, (8, 256), device=device)
        return model, lambda: nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    if name == "recsys":
        class RecSys(nn.Module):
            def __init__(self):
                super().__init__()
                self.users = nn.Embedding(500_000, 64)
                self.items = nn.Embedding(500_000, 64)
                self.mlp = nn.Sequential(nn.Linear(128, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                         nn.Linear(1024, 1))

            def forward(self, users, items):
                return self.mlp(torch.cat([self.users(users), self.items(items)], 1)).squeeze(1)

        model = RecSys().to(device) if move else RecSys()
        users = torch.randint(0, 500_000, (4096,), device=device)
        items = torch.randint(0, 500_000, (4096,), device=device)
        target = torch.rand(4096, device=device)
        return model, lambda: nn.functional.mse_loss(model(users, items), target)
    raise SystemExit(f"bench_dryrun: unknown model {name!r} (one of {', '.join(MODELS)})")


def train(model, loss_fn, torch, steps, between=None):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(steps):
        if step and between:
            between()
        loss = loss_fn()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


def worker(model_name, mode, steps):
    """Prints `RESULT {json}` with what the worker saw."""
    import torch

    result = {"model": model_name, "mode": mode, "pid": os.getpid(), "torch": torch.__version__}
    if mode in ("cuda", "cuda-ctx"):
        torch.manual_seed(0)
        if mode == "cuda":
            model, loss_fn = build_model(model_name, torch, "cuda")
        else:  # the parameters made on the device: `with torch.device("cuda"):`
            with torch.device("cuda"):
                model, loss_fn = _build_model(model_name, torch, "cuda")
        train(model, loss_fn, torch, steps)
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        result.update(max_memory_allocated=torch.cuda.max_memory_allocated(),
                      max_memory_reserved=torch.cuda.max_memory_reserved(),
                      memory_reserved=torch.cuda.memory_reserved(), held=total - free)
    elif mode == "memtracker":
        from torch.distributed._tools.mem_tracker import MemTracker

        # The meta device: tensors with shapes and no storage, so nothing runs and no GPU is needed.
        # (FakeTensorMode on "cuda" is the documented way, but without a GPU the autograd engine
        # refuses the backward pass: "hasPrimaryContext expects a valid device index"; on a device
        # it gives the same bytes as meta for the models where it runs, and it fails inside
        # nn.MultiheadAttention with "Mixing fake modes NYI" for the transformer.)
        model, loss_fn = build_model(model_name, torch, "meta")
        tracker = MemTracker()
        # Made before the tracker's context, so registered, as its docstring shows.
        tracker.track_external(model)
        with tracker:
            # MemTracker tracks one iteration: reset_mod_stats between steps, as its error asks;
            # the peak it keeps is then the last step's.
            train(model, loss_fn, torch, steps, tracker.reset_mod_stats)
        peak = tracker.get_tracker_snapshot("peak")
        meta = next((snap for dev, snap in peak.items() if str(dev) == "meta"), {})
        result.update(peak=meta.get("Total", 0),
                      breakdown={key: value for key, value in meta.items() if key != "Total"})
    else:
        raise SystemExit(f"bench_dryrun: unknown worker mode {mode!r}")
    print("RESULT " + json.dumps(result), flush=True)




# ----------------------------------------------------------------------------------------------
# The bench: runs the worker three ways per model (system python, standard library only).


class BenchError(Exception):
    pass


def run(argv, timeout, env=None, cwd=None):
    """Runs a command; (stdout, stderr). Fails with its output when it fails."""
    started = time.monotonic()
    try:
        result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, errors="replace",
                                 timeout=timeout, env=env, cwd=cwd, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BenchError(f"`{' '.join(map(str, argv))}` ran past {timeout} s")
    if result.returncode != 0:
        raise BenchError(f"`{' '.join(map(str, argv))}` exited {result.returncode} after "
                         f"{time.monotonic() - started:.0f} s:\n{tail_of(result.stdout)}\n{tail_of(result.stderr)}")
    return result.stdout, result.stderr


def tail_of(text, lines=30):
    return "\n".join(text.strip().splitlines()[-lines:])


def worker_result(text, who):
    for line in reversed(text.splitlines()):
        if line.startswith("RESULT {"):
            return json.loads(line[len("RESULT "):])
    raise BenchError(f"{who} printed no RESULT line:\n{tail_of(text)}")


def torch_python(given):
    if given:
        return given
    if os.environ.get("GPUVISOR_TORCH_PYTHON"):
        return os.environ["GPUVISOR_TORCH_PYTHON"]
    out, _ = run(["bash", ROOT / "tests" / "frameworks" / "venv.sh", "torch"], timeout=1800)
    return out.strip().splitlines()[-1]


def gpuvisor_binary():
    if os.environ.get("GPUVISOR_BIN"):
        return Path(os.environ["GPUVISOR_BIN"])
    binary = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "gpuvisor"
    if not binary.exists():
        run(["cargo", "build", "-p", "gpuvisor-cli"], timeout=3600, cwd=ROOT)
    return binary


SIMULATE = ["--simulate", "h100", "--mem-per-process", "64GiB"]


def measure_gpuvisor(binary, python, model, mode="cuda"):
    """(a): the real allocator on the simulator; the ledger's peak and torch's own counters."""
    argv = [binary, "exec", *SIMULATE, "--json", "--", python, THIS, "--worker", model, mode]
    out, err = run(argv, timeout=900)
    result = worker_result(out, f"the {model} worker under gpuvisor")
    try:
        summary = json.loads(err.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BenchError(f"gpuvisor exec --json printed no summary last:\n{tail_of(err)}")
    entry = next((p for p in summary.get("processes", []) if p["pid"] == result["pid"]), None)
    if entry is None:
        raise BenchError(f"pid {result['pid']} is not in gpuvisor's summary: {summary}")
    return {"ledger": entry["peak_bytes"][0], "reserved": result["max_memory_reserved"],
            "allocated": result["max_memory_allocated"], "torch": result["torch"]}


def measure_memtracker(python, model):
    """(b): torch.distributed._tools.mem_tracker.MemTracker on the meta device, on the CPU."""
    out, _ = run([python, THIS, "--worker", model, "memtracker"], timeout=900)
    result = worker_result(out, f"the {model} MemTracker worker")
    return {"peak": result["peak"], "breakdown": result["breakdown"]}


def fakegpu_version(checkout):
    text = (checkout / "fakegpu" / "_version.py").read_text() if (checkout / "fakegpu" / "_version.py").exists() else ""
    found = [line.split("=", 1)[1].strip().strip("'\"") for line in text.splitlines()
             if line.strip().startswith("__version__")]
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return (found[0] if found else "unknown version") + (f" (commit {commit})" if commit else "")


def measure_fakegpu(checkout, python, model, work, mode="cuda"):
    """(c): FakeGPU's preflight, its fakecuda runtime (torch patched to run on the CPU)."""
    report_dir = work / f"fakegpu-{model}-{mode}"
    env = dict(os.environ, PYTHONPATH=str(checkout))
    run([python, "-m", "fakegpu", "preflight", "--runtime", "fakecuda", "--profile", "h100",
         "--device-count", "1", "--report-dir", report_dir, "--", python, THIS, "--worker", model, mode],
        timeout=1800, env=env, cwd=work)
    report = json.loads((report_dir / "preflight_report.json").read_text())
    if not report.get("devices"):
        raise BenchError(f"FakeGPU's report has no devices: {report_dir / 'preflight_report.json'}")
    device = report["devices"][0]
    return {"requested": device.get("allocated_peak_memory", device.get("peak_memory")),
            "reserved": device.get("peak_reserved_memory", device.get("peak_memory")),
            "status": report.get("status"), "confidence": report.get("tracking_confidence"),
            "allocations": device.get("allocation_count"),
            "operators": sorted((report.get("dispatch_tracking") or {}).get("operators", {}))}


def fakegpu_native(checkout, python, model, work):
    """FakeGPU's native runtime (its own libcuda/libcudart/libnccl preloaded, the real torch wheel
    above them), when the checkout has a CMake build in build/: its status and the child's last
    error line."""
    build = checkout / "build"
    if not (build / "libcuda.so.1").exists():
        return f"not tried: no CMake build in {build} (`cmake -S . -B build && cmake --build build`)"
    report_dir = work / f"fakegpu-native-{model}"
    env = dict(os.environ, PYTHONPATH=str(checkout))
    subprocess.run([python, "-m", "fakegpu", "preflight", "--runtime", "native", "--build-dir", str(build),
                    "--profile", "h100", "--device-count", "1", "--report-dir", str(report_dir), "--", python,
                    str(THIS), "--worker", model, "cuda"], env=env, cwd=work, capture_output=True, timeout=900)
    try:
        report = json.loads((report_dir / "preflight_report.json").read_text())
    except (OSError, ValueError) as error:
        return f"no report ({error})"
    stderr = (report_dir / "preflight_stderr.log")
    errors = [line.strip() for line in (stderr.read_text(errors="replace").splitlines() if stderr.exists() else [])
              if "Error" in line]
    status = report.get("status")
    if status == "PASS_FIT":
        device = (report.get("devices") or [{}])[0]
        return f"PASS_FIT, peak {mib(device.get('peak_memory'))} MiB"
    error = re.sub(r"/\S*/([^/\s]+\.so[.\d]*)", r"\1", errors[-1]) if errors else "no error line"
    return f"{status}: `{error}`"


def mib(value):
    return "–" if value is None else f"{value / MIB:,.0f}"


def ratio(value, reference):
    return "–" if value is None or not reference else f"{value / reference:.2f}x"


def section(args):
    # Also called by scripts/bench.py (whose arguments have only --quick), which then draws the
    # chart through bench_section_charts.BUILDERS.
    register_chart()
    models = getattr(args, "models", None) or list(MODELS)
    python = torch_python(getattr(args, "torch_python", None))
    binary = gpuvisor_binary()
    checkout = getattr(args, "fakegpu", None) or os.environ.get("FAKEGPU_DIR")
    fakegpu_note = None
    if checkout and not (Path(checkout) / "fakegpu" / "preflight.py").exists():
        fakegpu_note = f"skipped: {checkout} is not a FakeGPU checkout (no fakegpu/preflight.py)"
        checkout = None
    elif not checkout:
        fakegpu_note = "skipped: no FakeGPU checkout given (--fakegpu DIR or $FAKEGPU_DIR)"
    rows, failures, native, variant, variant_gpuvisor = {}, [], None, None, None
    repeat = not args.quick
    with tempfile.TemporaryDirectory(prefix="gpuvisor-bench-dryrun-") as tmp:
        for model in models:
            row = rows[model] = {}
            for name, measure in (
                    ("gpuvisor", lambda: measure_gpuvisor(binary, python, model)),
                    ("memtracker", lambda: measure_memtracker(python, model)),
                    ("fakegpu", (lambda: measure_fakegpu(Path(checkout), python, model, Path(tmp)))
                     if checkout else None)):
                if measure is None:
                    continue
                print(f"bench: dryrun {model} / {name} ...", file=sys.stderr)
                started = time.monotonic()
                try:
                    row[name] = measure()
                    row[name]["seconds"] = time.monotonic() - started
                except BenchError as error:
                    failures.append(f"{model} / {name}: {error}")
                    print(f"bench: {model} / {name} failed: {error}", file=sys.stderr)
            if checkout and variant is None and "fakegpu" in row:
                print(f"bench: dryrun {model} / FakeGPU, made under torch.device(\"cuda\") ...", file=sys.stderr)
                try:
                    variant = (model, measure_fakegpu(Path(checkout), python, model, Path(tmp), "cuda-ctx"))
                    variant_gpuvisor = measure_gpuvisor(binary, python, model, "cuda-ctx")
                except BenchError as error:
                    failures.append(f"{model} / FakeGPU under torch.device: {error}")
            if checkout and native is None:
                print(f"bench: dryrun {model} / FakeGPU native ...", file=sys.stderr)
                native = fakegpu_native(Path(checkout), python, model, Path(tmp))
            if repeat and "gpuvisor" in row:
                again = measure_gpuvisor(binary, python, model)
                row["gpuvisor"]["repeat_same"] = all(again[k] == row["gpuvisor"][k]
                                                     for k in ("ledger", "reserved", "allocated"))
    return render(rows, failures, fakegpu_note, fakegpu_version(Path(checkout)) if checkout else None,
                  python, repeat, native, variant, variant_gpuvisor)


def render(rows, failures, fakegpu_note, fakegpu_label, python, repeat, native=None, variant=None,
           variant_gpuvisor=None):
    torch_version = next((r["gpuvisor"]["torch"] for r in rows.values() if "gpuvisor" in r), "?")
    lines = [
        f"## {HEADING}", "",
        "Command: `python3 scripts/bench_dryrun.py --fakegpu DIR --write` (DIR: a checkout of "
        "github.com/FanBB2333/FakeGPU; without it that column says skipped). "
        f"torch {torch_version} (tests/frameworks/requirements-torch.txt).", "",
        f"What is predicted: the peak device memory of {STEPS} training steps (forward, cross-entropy or MSE "
        "loss, backward, `torch.optim.Adam` step, `zero_grad`) of models built in code with random "
        "weights; the second step is the steady state (Adam's state exists while the gradients are "
        "made). fp32, default allocator settings. There is no GPU here, so none of the three is "
        "checked against hardware: the table compares what each can see.", "",
        "- **gpuvisor**: `gpuvisor exec --simulate h100 --mem-per-process 64GiB --json -- python "
        "bench_dryrun.py --worker MODEL cuda`: the real torch wheel, its caching allocator, cuBLAS and "
        "cuDNN run on the simulator. *Ledger peak*: the summary's `peak_bytes` (everything the process "
        "allocated on the card: torch's pool plus what the CUDA libraries allocate through the driver "
        "themselves; the CUDA context is not in it). *reserved* / *allocated*: torch's own `max_memory_reserved()` / "
        "`max_memory_allocated()`, printed by the script under the simulator. (80 GiB is refused: the "
        "simulated H100 has 79.6 GiB.)",
        "- **MemTracker**: `torch.distributed._tools.mem_tracker.MemTracker` around the same steps "
        "(`track_external(model)`, `reset_mod_stats()` between steps as it requires), the model and batch "
        "on the `meta` device, on the CPU: the peak of the tensors it tracks. The documented "
        "FakeTensorMode on `cuda` cannot run backward without a GPU (\"hasPrimaryContext expects a valid "
        "device index\"); run on a device (the simulator) it gives the same bytes as `meta` for the MLP, "
        "the ResNet and the recommender, and fails inside `nn.MultiheadAttention` for the transformer "
        "(\"Mixing fake modes NYI\").",
        "- **FakeGPU** " + (f"{fakegpu_label}: " if fakegpu_label else "") +
        "`python -m fakegpu preflight --runtime fakecuda --profile h100 --device-count 1 -- python "
        "bench_dryrun.py --worker MODEL cuda`: torch patched to run the ops on the CPU with its "
        "allocator model. *reserved* / *requested*: its report's `peak_reserved_memory` / "
        "`allocated_peak_memory`." + (f" **{fakegpu_note}.**" if fakegpu_note else ""), "",
        "Models (" + ", ".join(f"`{name}`" for name in rows) + f"; `{HELD_OUT}` is held out: chosen and sized "
        "before any figure was seen, never tuned to; one change was made after a first run, for every model: "
        "the models are moved with `.to(\"cuda\")` instead of being made under `with torch.device(\"cuda\")`, "
        "after that run showed FakeGPU not tracking the latter, see below):", "",
    ]
    lines += [f"- `{name}`: {MODELS[name]}" for name in rows]
    lines += ["", "Peaks in MiB:", "",
              "| model | gpuvisor: ledger peak | gpuvisor: torch reserved | gpuvisor: torch allocated | "
              "MemTracker | FakeGPU reserved | FakeGPU requested |",
              "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        g, m, f = row.get("gpuvisor", {}), row.get("memtracker", {}), row.get("fakegpu", {})
        label = f"`{name}`" + (" (held out)" if name == HELD_OUT else "")
        lines.append(f"| {label} | **{mib(g.get('ledger'))}** | {mib(g.get('reserved'))} | "
                     f"{mib(g.get('allocated'))} | {mib(m.get('peak'))} | {mib(f.get('reserved'))} | "
                     f"{mib(f.get('requested'))} |")
    lines += ["", "Ratios, like for like (tensor bytes against torch's `max_memory_allocated()`, pools "
              "against `max_memory_reserved()`, and each against the ledger peak, what the card "
              "holds for the process):", "",
              "| model | MemTracker ÷ allocated | FakeGPU requested ÷ allocated | FakeGPU reserved ÷ reserved | "
              "ledger ÷ reserved | MemTracker ÷ ledger | FakeGPU reserved ÷ ledger |",
              "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        g, m, f = row.get("gpuvisor", {}), row.get("memtracker", {}), row.get("fakegpu", {})
        label = f"`{name}`" + (" (held out)" if name == HELD_OUT else "")
        lines.append(f"| {label} | {ratio(m.get('peak'), g.get('allocated'))} | "
                     f"{ratio(f.get('requested'), g.get('allocated'))} | {ratio(f.get('reserved'), g.get('reserved'))} | "
                     f"{ratio(g.get('ledger'), g.get('reserved'))} | {ratio(m.get('peak'), g.get('ledger'))} | "
                     f"{ratio(f.get('reserved'), g.get('ledger'))} |")
    lines.append("")
    notes = []
    outside = [(name, row["gpuvisor"]["ledger"] - row["gpuvisor"]["reserved"]) for name, row in rows.items()
               if "gpuvisor" in row]
    if outside:
        notes.append("Outside torch's pool (ledger − torch reserved: what the CUDA libraries allocated through "
                     "the driver themselves, cuBLAS/cuBLASLt workspaces per docs/frameworks-tests.md; no torch "
                     "counter shows it): " +
                     ", ".join(f"`{name}` {value / MIB:,.0f} MiB" for name, value in outside) + ".")
    if repeat:
        same = [name for name, row in rows.items() if row.get("gpuvisor", {}).get("repeat_same")]
        notes.append(f"Each gpuvisor dry run was made twice: the same bytes both times for {len(same)} of "
                     f"{sum('gpuvisor' in r for r in rows.values())} models.")
    fake = [(name, row["fakegpu"]) for name, row in rows.items() if "fakegpu" in row]
    if fake:
        notes.append("FakeGPU's verdicts: " + ", ".join(
            f"`{name}` {f['status']} ({f['confidence']}, {f['allocations']} allocations tracked, from "
            f"{len(f['operators'])} operators: {', '.join(op.replace('aten.', '').replace('.default', '') for op in f['operators'])})"
            for name, f in fake) + ".")
    if variant:
        name, f = variant
        g = rows[name].get("gpuvisor", {})
        notes.append(
            f"The idiom matters to FakeGPU: with `{name}` made under `with torch.device(\"cuda\"):` (parameters "
            "created on the device, as MemTracker's run makes them on `meta`) instead of `.to(\"cuda\")`, its "
            f"peak was {mib(f['requested'])} MiB requested / {mib(f['reserved'])} MiB reserved "
            f"({f['allocations']} allocations tracked, from {len(f['operators'])} operators), against "
            f"{mib(rows[name]['fakegpu']['reserved'])} MiB reserved above. gpuvisor's dry run of that variant: "
            f"{mib(variant_gpuvisor['ledger']) if variant_gpuvisor else '–'} MiB ledger peak, "
            f"{mib(variant_gpuvisor['reserved']) if variant_gpuvisor else '–'} MiB torch reserved "
            f"(above: {mib(g.get('ledger'))} and {mib(g.get('reserved'))}).")
    if native:
        notes.append(f"FakeGPU's native runtime (`--runtime native --build-dir DIR/build`, its own libcuda, "
                     f"libcudart 12 and libnccl preloaded under the real torch wheel), `{next(iter(rows))}`: {native}.")
    seconds = {name: {k: v["seconds"] for k, v in row.items() if isinstance(v, dict) and "seconds" in v}
               for name, row in rows.items()}
    notes.append("Wall time per run (s): " + "; ".join(
        f"`{name}` " + ", ".join(f"{k} {v:.0f}" for k, v in spent.items()) for name, spent in seconds.items()) + ".")
    for failure in failures:
        notes.append(f"**Failed**: {failure.splitlines()[0]}")
    for note in notes + reading(rows):
        lines += [note, ""]
    return lines[:-1]



def spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    low, high = min(values), max(values)
    return f"{low:.2f}x" if abs(high - low) < 0.005 else f"{low:.2f}–{high:.2f}x"


def reading(rows):
    """What the figures say, computed from them (so it stays true when they change)."""
    def ratios(method, key, ref_method, ref_key):
        return [row[method][key] / row[ref_method][ref_key] for row in rows.values()
                if method in row and ref_method in row and row[ref_method][ref_key]]

    lines = []
    if any("gpuvisor" in row for row in rows.values()):
        lines.append(
            f"Reading: gpuvisor's ledger peak is torch's own `max_memory_reserved()` plus what the process "
            f"allocated outside torch's pool through the driver ({spread(ratios('gpuvisor', 'ledger', 'gpuvisor', 'reserved'))} "
            "of the pool here); torch's pool is in turn above the tensors' bytes (`max_memory_allocated()`) by the "
            "caching allocator's rounding, segments and cache. MemTracker models neither layer; FakeGPU models "
            "the first (its allocator model) but not the second. What the simulator cannot show is listed in docs/simulator.md: data-dependent shapes "
            "(device memory reads back as zeros) and choices made by timing kernels (autotuning).")
    if any("memtracker" in row for row in rows.values()):
        lines.append(
            f"MemTracker counts tensor bytes: {spread(ratios('memtracker', 'peak', 'gpuvisor', 'allocated'))} of torch's "
            f"`max_memory_allocated()` under the simulator, {spread(ratios('memtracker', 'peak', 'gpuvisor', 'ledger'))} of "
            "the ledger peak. On the `meta` device operators take their device-independent paths"
            + (": scaled-dot-product attention in the transformer is the math path there (the attention matrix "
               "materialised and kept for backward) where torch picks the memory-efficient kernel on an sm_90 card "
               "in fp32" if "transformer" in rows else "") + ".")
    fake = {name: row["fakegpu"] for name, row in rows.items() if "fakegpu" in row}
    if fake:
        text = (f"FakeGPU's reserved peak is {spread(ratios('fakegpu', 'reserved', 'gpuvisor', 'reserved'))} of torch's "
                f"own `max_memory_reserved()` under the simulator and {spread(ratios('fakegpu', 'reserved', 'gpuvisor', 'ledger'))} "
                "of the ledger peak: it runs the operators on the CPU, so it sees the CPU's choices of kernel (the "
                "math path of attention, for one), and not the CUDA libraries' own allocations")
        untracked = [name for name, f in fake.items()
                     if not any("backward" in op or "foreach" in op or "addcdiv" in op or "sqrt" in op
                                for op in f["operators"])]
        if untracked:
            text += (f"; for {', '.join(f'`{n}`' for n in untracked)} the operators its dispatch tracking saw "
                     "(listed above) are all forward ones: no backward or optimizer operator, so gradients and "
                     "Adam's state are missing from its peak under torch "
                     + next(iter(rows.values())).get("gpuvisor", {}).get("torch", "2.15"))
        lines.append(text + ".")
    return lines


def chart(text):
    """The section's chart: each model's peak as each tool predicts it (bench_section_charts)."""
    from bench_charts import Bar, Chart, Panel
    from bench_section_charts import ChartError, first_table, number, plain

    header, rows = first_table(text, "dryrun", "ledger peak")
    panels = []
    for row in rows:
        bars = []
        for column, cell in zip(header[1:], row[1:]):
            if plain(cell) in ("–", ""):
                continue
            bars.append(Bar(plain(column), number(cell), series="gpuvisor" if "gpuvisor" in column else "baseline",
                            text=f"{plain(cell)} MiB"))
        if not bars:
            raise ChartError(f"no figures for {row[0]}")
        panels.append(Panel(plain(row[0]), "MiB", bars))
    return Chart("Memory dry runs: predicted peak of a training step", panels,
                 ["Blue: gpuvisor's dry run (the real torch allocator on the simulator). No GPU: nothing "
                  "here is checked against hardware."])


def register_chart():
    """scripts/bench.py draws every section's chart with bench_section_charts.with_chart."""
    import bench_section_charts

    bench_section_charts.BUILDERS.setdefault("dryrun", chart)


def main():
    sys.path.insert(0, str(ROOT / "scripts"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each gpuvisor dry run once (not twice)")
    parser.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    parser.add_argument("--torch-python", help="the torch venv's python (default: tests/frameworks/venv.sh torch)")
    parser.add_argument("--fakegpu", help="a checkout of github.com/FanBB2333/FakeGPU (default $FAKEGPU_DIR)")
    parser.add_argument("--models", nargs="*", choices=list(MODELS), help="only these models")
    args = parser.parse_args()
    try:
        lines = section(args)
    except BenchError as error:
        sys.exit(f"bench_dryrun: {error}")
    print("\n".join(lines))
    if args.write:
        from bench import DOC, replace_section  # here: bench.py imports this file
        from bench_section_charts import with_chart

        register_chart()
        replace_section(HEADING, "\n".join(with_chart("dryrun", lines, DOC)))


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    worker(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else STEPS)
    sys.exit(0)

if __name__ == "__main__":
    main()
