"""Every driver entry point and export table that PyTorch, JAX and CuPy asked the simulator for
and it does not serve, compared with tests/frameworks/unserved-<framework>.txt.

The simulator appends one line per unserved request to $GPUVISOR_SIM_LOG_UNSERVED (`entry NAME`,
`procaddress NAME VERSION`, `table UUID`); every framework run of test_torch, test_jax and
test_cupy sets it (fwtest.FrameworkTest.command). This test uses what those runs collected in
this test process, and runs the framework's checks itself for any that did not run here, so it
also works alone. A new wheel that asks for something new shows up as a readable diff;
GPUVISOR_UPDATE_UNSERVED=1 rewrites the files (docs/frameworks-tests.md).
"""

import difflib
import os
import unittest

import fwtest
import test_cupy
import test_jax
import test_torch

MODULES = {"torch": test_torch, "jax": test_jax, "cupy": test_cupy}
HEADER = """\
# Driver requests {framework} made that gpuvisor-sim does not serve, one per line, sorted:
# `entry NAME`, `procaddress NAME VERSION`, `table UUID` (see GPUVISOR_SIM_LOG_UNSERVED).
# Checked by tests/frameworks/test_unserved.py; rewrite with GPUVISOR_UPDATE_UNSERVED=1.
"""


def expectation(framework):
    return fwtest.HERE / f"unserved-{framework}.txt"


def read_expected(path):
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return sorted({line for line in lines if line and not line.startswith("#")})


def tests_of(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from tests_of(item)
        else:
            yield item


class UnservedTest(unittest.TestCase):
    def check(self, framework):
        module = MODULES[framework]
        tests = list(tests_of(unittest.defaultTestLoader.loadTestsFromModule(module)))
        missing = [t for t in tests if t.id() not in fwtest.COLLECTED_TESTS]
        notes = []
        if missing:
            result = unittest.TestResult()
            unittest.TestSuite(missing).run(result)
            problems = result.failures + result.errors
            if problems:
                notes.append(f"note: {len(problems)} of the {framework} checks failed when run "
                             "here, so the list may be incomplete: "
                             + ", ".join(t.id().rsplit(".", 1)[-1] for t, _ in problems))
            if result.skipped and len(result.skipped) == len(missing) and not any(
                    t.id() in fwtest.COLLECTED_TESTS for t in tests):
                self.skipTest(result.skipped[0][1])
        actual = sorted(fwtest.UNSERVED.get(framework, set()))
        path = expectation(framework)
        expected = read_expected(path)
        print(f"\n  {framework}: {len(actual)} unserved request(s) ", end="", flush=True)
        if os.environ.get("GPUVISOR_UPDATE_UNSERVED") == "1":
            path.write_text(HEADER.format(framework=framework) + "".join(l + "\n" for l in actual))
            print(f"(wrote {path.name}) ", end="", flush=True)
            return
        if actual != expected:
            diff = "\n".join(difflib.unified_diff(
                expected, actual, f"{path.name} (committed)", f"{framework} (this run)",
                lineterm="", n=0))
            self.fail(f"the driver requests {framework} made that the simulator does not serve "
                      f"changed ('+': new, unserved; '-': no longer asked for, or served now):\n"
                      f"{diff}\n" + "".join(n + "\n" for n in notes)
                      + "if this is expected, rewrite the list: GPUVISOR_UPDATE_UNSERVED=1 "
                      "python3 -m unittest discover -s tests/frameworks -p 'test_unserved.py'")

    def test_torch(self):
        self.check("torch")

    def test_jax(self):
        self.check("jax")

    def test_cupy(self):
        self.check("cupy")


if __name__ == "__main__":
    unittest.main()
