"""The Python test scripts' runner: unittest, then the `UGDS-PY passed=N failed=M skipped=K` line
`cargo xtask test` counts (skipped tests are not counted as passed)."""

from __future__ import annotations

import sys
import unittest


def run(module_name: str) -> int:
    """Runs every test of the module; returns the exit status (0: none failed)."""
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[module_name])
    r = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(r.failures) + len(r.errors) + len(r.unexpectedSuccesses)
    skipped = len(r.skipped)
    print(f"UGDS-PY passed={r.testsRun - failed - skipped} failed={failed} skipped={skipped}")
    return 0 if failed == 0 else 1
