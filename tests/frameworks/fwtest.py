"""What the framework tests share: the gpuvisor binary, the venvs, running a worker under
`gpuvisor exec` / `gpuvisor run` with a time limit, and dumping everything a failure needs.

The tests run under the system python (stdlib only); the workers run in a framework venv's
python (tests/frameworks/venv.sh), under gpuvisor with the simulator. A worker reports on stdout
with lines `RESULT {json}` (what it saw) and `VERSIONS {json}` (what it ran).
docs/frameworks-tests.md says how to run them.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
GIB = 1 << 30
MIB = 1 << 20
IN_CI = bool(os.environ.get("CI"))

# Unserved driver requests (GPUVISOR_SIM_LOG_UNSERVED) seen by each framework's runs in this
# process, and the tests whose runs were collected: test_unserved.py reads both.
UNSERVED = {}
COLLECTED_TESTS = set()

_venvs = {}


def gpuvisor_bin():
    """$GPUVISOR_BIN, else target/debug/gpuvisor of this checkout. A missing binary fails the test
    (it is no reason to skip: build it)."""
    path = Path(os.environ.get("GPUVISOR_BIN") or REPO / "target" / "debug" / "gpuvisor")
    if not (path.is_file() and os.access(path, os.X_OK)):
        how = "$GPUVISOR_BIN" if os.environ.get("GPUVISOR_BIN") else "target/debug/gpuvisor"
        raise AssertionError(
            f"the gpuvisor binary is missing: {path} ({how}); build it with "
            "`cargo build -p gpuvisor-cli` or point GPUVISOR_BIN at one")
    return str(path)


_warmed = set()


def venv_python(test, name):
    """The python of venv NAME (torch | jax): $GPUVISOR_TORCH_PYTHON / $GPUVISOR_JAX_PYTHON, else
    built (or reused) by venv.sh. When it cannot be had the test skips, saying why, or fails
    where $CI is set."""
    variable = f"GPUVISOR_{name.upper()}_PYTHON"
    if name not in _venvs:
        given = os.environ.get(variable)
        if given:
            ok = os.access(given, os.X_OK)
            _venvs[name] = (given if ok else None,
                            f"${variable} = {given} is not an executable python")
        else:
            started = time.monotonic()
            sys.stderr.write(f"\n[frameworks] ${variable} unset: building the {name} venv with "
                             "tests/frameworks/venv.sh (minutes, once)\n")
            proc = subprocess.run(["bash", str(HERE / "venv.sh"), name], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
            python = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
            if proc.returncode == 0 and os.access(python, os.X_OK):
                sys.stderr.write(f"[frameworks] {name} venv ready in "
                                 f"{time.monotonic() - started:.0f} s: {python}\n")
                _venvs[name] = (python, "")
            else:
                _venvs[name] = (None, f"tests/frameworks/venv.sh {name} failed (exit "
                                      f"{proc.returncode}):\n{proc.stderr[-4000:]}")
    python, why = _venvs[name]
    if python is None:
        message = f"no {name} venv: {why}"
        if IN_CI:
            raise AssertionError(message + "\n($CI is set: a missing venv is a failure)")
        test.skipTest(message)
    if name not in _warmed:
        # A venv just built on a busy machine may be out of the page cache: the first
        # `import torch` then reads GBs from disk, and a job's first process sat quiet (in
        # disk wait) past a 10 s stall_after before its ranks started (seen in CI on a fresh
        # machine). Read it once here, outside any test's timing.
        _warmed.add(name)
        module = {"torch": "torch", "jax": "jax", "cupy": "cupy"}.get(name)
        if module:
            subprocess.run([python, "-c", f"import {module}"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=300, check=False)
    return python


class Run:
    """One command that ran: its argv, environment additions, status, output, and what gpuvisor
    recorded (the `exec --json` summary, or a `run` directory)."""

    def __init__(self, argv, env_extra, cwd):
        self.argv, self.env_extra, self.cwd = argv, env_extra, cwd
        self.returncode = None
        self.stdout = self.stderr = ""
        self.seconds = 0.0
        self.timed_out = False
        self.summary = None  # gpuvisor exec --json's object
        self.run_dir = None  # gpuvisor run's directory

    def log(self, name):
        """A `gpuvisor run` process's log (logs/NAME.log, e.g. `actor.0`)."""
        path = self.run_dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def results(self, kind="RESULT", text=None):
        """The worker's `KIND {json}` lines, parsed, in order (from TEXT, else stdout, else all
        of the run's logs)."""
        if text is None:
            text = self.stdout
            if self.run_dir is not None and self.run_dir.exists() and not text:
                text = "\n".join(p.read_text(errors="replace")
                                 for p in sorted((self.run_dir / "logs").glob("*.log")))
        return [json.loads(line.split(kind + " ", 1)[1]) for line in text.splitlines()
                if (kind + " ") in line and line.split(kind + " ", 1)[1].startswith("{")]

    def result(self, kind="RESULT", text=None, who="the worker"):
        found = self.results(kind, text)
        if not found:
            raise AssertionError(f"{who} printed no `{kind} {{...}}` line")
        merged = {}
        for item in found:
            merged.update(item)
        return merged

    def process(self, pid):
        """The exec summary's entry of a process."""
        for entry in (self.summary or {}).get("processes", []):
            if entry["pid"] == pid:
                return entry
        raise AssertionError(f"pid {pid} is not in gpuvisor's summary: {self.summary}")

    def peak(self, pid, device=0):
        """The ledger's peak for a process on a GPU (the exec summary's `peak_bytes`)."""
        return self.process(pid)["peak_bytes"][device]

    def denials_of(self, pid):
        return [d for d in (self.summary or {}).get("denials", []) if d["pid"] == pid]

    def dump(self):
        """Everything a failure needs: the command, its environment additions, its status and
        full output, and gpuvisor's record."""
        lines = [f"$ cd {self.cwd} && " + " ".join(f"{k}={shlex.quote(v)}"
                                                    for k, v in self.env_extra.items())
                 + (" " if self.env_extra else "") + shlex.join(self.argv),
                 f"exit status: {self.returncode}" + (" (killed: time limit)" if self.timed_out
                                                       else "") + f", {self.seconds:.1f} s",
                 "--- stdout ---", self.stdout.rstrip(), "--- stderr ---", self.stderr.rstrip()]
        if self.run_dir is not None:
            lines.append(f"--- run directory {self.run_dir} ---")
            if self.run_dir.exists():
                for path in sorted(self.run_dir.rglob("*")):
                    if path.is_file():
                        lines.append(f"{path.stat().st_size:>12}  {path.relative_to(self.run_dir)}")
                for path in [self.run_dir / "events.jsonl",
                             *sorted((self.run_dir / "logs").glob("*.log"))]:
                    if path.is_file():
                        lines += [f"--- {path.relative_to(self.run_dir)} ---",
                                  path.read_text(errors="replace").rstrip()]
            else:
                lines.append("(missing)")
        return "\n".join(lines)


class FrameworkTest(unittest.TestCase):
    """Base class: runs commands with a time limit, keeps them, and on any failure or error
    prints each one in full (command, output, gpuvisor's record) before the traceback."""

    framework = None  # "torch" | "jax" | "cupy": where unserved driver requests are counted
    venv = None  # "torch" | "jax"
    timeout = 300

    def setUp(self):
        self.runs = []
        self.python = venv_python(self, self.venv) if self.venv else None
        self.bin = gpuvisor_bin()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"gpuvisor-fw-{self._testMethodName}-"))
        self.addCleanup(self._cleanup)

    def _cleanup(self):
        subprocess.run(["rm", "-rf", str(self.tmp)], check=False)

    def _callTestMethod(self, method):
        try:
            super()._callTestMethod(method)
        except unittest.SkipTest:
            raise
        except BaseException:
            sys.stderr.write(f"\n======== {self.id()} failed; what it ran:\n")
            for run in self.runs:
                sys.stderr.write(run.dump() + "\n========\n")
            sys.stderr.flush()
            raise
        finally:
            if self.framework and self.runs:
                COLLECTED_TESTS.add(self.id())

    def command(self, argv, env=None, timeout=None, cwd=None):
        """Run ARGV (in its own process group, killed whole at the time limit); returns a Run."""
        env_extra = dict(env or {})
        full_env = dict(os.environ)
        for key, value in env_extra.items():
            if value is None:
                full_env.pop(key, None)
            else:
                full_env[key] = value
        env_extra = {k: v for k, v in env_extra.items() if v is not None}
        cwd = str(cwd or self.tmp)
        run = Run([str(a) for a in argv], env_extra, cwd)
        self.runs.append(run)
        unserved = None
        if self.framework:
            unserved = self.tmp / f"unserved-{len(self.runs)}.txt"
            full_env["GPUVISOR_SIM_LOG_UNSERVED"] = str(unserved)
        limit = timeout or self.timeout
        started = time.monotonic()
        proc = subprocess.Popen(run.argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", start_new_session=True)
        try:
            run.stdout, run.stderr = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            run.timed_out = True
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                run.stdout, run.stderr = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                run.stdout, run.stderr = proc.communicate()
        run.seconds = time.monotonic() - started
        run.returncode = proc.returncode
        if unserved is not None and unserved.exists():
            lines = {line.strip() for line in unserved.read_text(errors="replace").splitlines()}
            UNSERVED.setdefault(self.framework, set()).update(l for l in lines if l)
        elif self.framework:
            UNSERVED.setdefault(self.framework, set())
        if run.timed_out:
            self.fail(f"`{shlex.join(run.argv)}` ran past its {limit} s limit")
        return run

    def exec_worker(self, worker, args=(), gpuvisor_args=(), env=None, timeout=None,
                    python=None, expect_status=0):
        """`gpuvisor exec --json GPUVISOR_ARGS -- PYTHON tests/frameworks/WORKER ARGS`; checks the
        exit status and prints the versions the worker ran."""
        argv = [self.bin, "exec", "--json", *gpuvisor_args, "--",
                python or self.python, str(HERE / worker), *args]
        run = self.command(argv, env=env, timeout=timeout)
        last = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
        try:
            run.summary = json.loads(last)
        except ValueError:
            run.summary = None
        self.report_versions(run)
        if expect_status is not None:
            self.assert_status(run, expect_status)
            self.assertIsNotNone(run.summary, "gpuvisor exec --json printed no JSON summary last")
        return run

    def run_job(self, job_text, gpuvisor_args=(), timeout=None, env=None, name="run"):
        """`gpuvisor run JOB --run-dir DIR -q GPUVISOR_ARGS` of a job file written here (ENV
        added to its environment; NAME names the job file and the run directory)."""
        job = self.tmp / f"{name}.toml"
        job.write_text(job_text)
        run_dir = self.tmp / name
        run = self.command([self.bin, "run", str(job), "--run-dir", str(run_dir), "-q",
                            *gpuvisor_args], timeout=timeout, env=env)
        run.run_dir = run_dir
        self.report_versions(run)
        return run

    _shared_runs = {}

    def shared_run(self, key, make):
        """A run several tests check (made once per test process by MAKE, which must not assert
        on it); it is dumped with any of those tests that fails."""
        if key in FrameworkTest._shared_runs:
            run = FrameworkTest._shared_runs[key]
            self.runs.append(run)
        else:
            run = FrameworkTest._shared_runs[key] = make()
        return run

    def assert_status(self, run, expected=0):
        argv = run.argv[run.argv.index("--") + 1:] if "--" in run.argv else run.argv
        self.assertEqual(run.returncode, expected,
                         f"`{shlex.join(argv)}` exited with {run.returncode}"
                         + (f":\n{tail(run.stderr)}" if run.returncode else ""))

    def report_versions(self, run):
        for versions in run.results("VERSIONS"):
            line = ", ".join(f"{k} {v}" for k, v in versions.items())
            sys.stderr.write(f"\n  [{self._testMethodName}] ran: {line} ")


def tail(text, lines=25):
    return "\n".join(text.rstrip().splitlines()[-lines:])


def events(run_dir):
    path = Path(run_dir) / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gib(n):
    return f"{n / GIB:.2f} GiB"
