"""Print the framework versions the framework tests run, as a Markdown table (for
docs/simulator.md), or as JSON with --json.

    python3 tests/frameworks/versions.py [--json]

Reads the venvs' package metadata (fwversions.py in each venv's python): $GPUVISOR_TORCH_PYTHON
and $GPUVISOR_JAX_PYTHON, else the venvs venv.sh builds (or reuses).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENVS = {"torch": ["torch"], "jax": ["jax", "cupy", "joblib"]}
COLUMNS = ["cudart", "cuBLAS", "cuDNN", "NCCL"]


def python_of(venv):
    given = os.environ.get(f"GPUVISOR_{venv.upper()}_PYTHON")
    if given:
        return given
    return subprocess.run(["bash", str(HERE / "venv.sh"), venv], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]


def collect():
    found = {}
    for venv, frameworks in VENVS.items():
        out = subprocess.run([python_of(venv), str(HERE / "fwversions.py"), *frameworks],
                             check=True, stdout=subprocess.PIPE, text=True).stdout
        for framework, versions in json.loads(out).items():
            found[framework] = {"venv": venv, **versions}
    return found


def table(found):
    rows = ["| framework | version | " + " | ".join(COLUMNS) + " | also | Python | venv |",
            "|---|---|" + "---|" * len(COLUMNS) + "---|---|---|"]
    for framework, versions in found.items():
        shown = {"python", "venv", framework, *COLUMNS}
        also = ", ".join(f"{k} {v}" for k, v in versions.items() if k not in shown and v != "-")
        rows.append(f"| {framework} | {versions.get(framework, '-')} | "
                    + " | ".join(versions.get(c, "-") for c in COLUMNS)
                    + f" | {also or '-'} | {versions['python']} | {versions['venv']} |")
    return "\n".join(rows)


def main():
    found = collect()
    print(json.dumps(found, indent=2) if "--json" in sys.argv[1:] else table(found))


if __name__ == "__main__":
    main()
