"""Run the framework tests (tests/frameworks/test_*.py) as `python3 -m unittest discover -s
tests/frameworks -v` does, then print each test's time and a closing line
`frameworks: N passed, N failed, N skipped`. Exit status 1 when any failed.

    python3 tests/frameworks/run.py [-k PATTERN ...]

-k selects tests by substring of their id, as unittest's -k does (repeatable).
"""

import argparse
import sys
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent


class TimedResult(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.times = []

    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        self.times.append((time.monotonic() - self._started, test.id()))
        super().stopTest(test)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", action="append", dest="patterns", default=[])
    args = parser.parse_args()
    loader = unittest.TestLoader()
    if args.patterns:
        loader.testNamePatterns = [f"*{p}*" for p in args.patterns]
    suite = loader.discover(str(HERE), pattern="test*.py", top_level_dir=str(HERE))
    started = time.monotonic()
    runner = unittest.TextTestRunner(verbosity=2, resultclass=TimedResult)
    result = runner.run(suite)
    print("\ntime per test:", file=sys.stderr)
    for seconds, test_id in result.times:
        print(f"  {seconds:7.1f} s  {test_id}", file=sys.stderr)
    print(f"  {time.monotonic() - started:7.1f} s  in all", file=sys.stderr)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    sys.stderr.flush()
    print(f"frameworks: {passed} passed, {failed} failed, {skipped} skipped", flush=True)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
