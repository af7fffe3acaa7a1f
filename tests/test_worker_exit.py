"""The worker's exit code is what its result document says, whatever the interpreter's teardown does after
it: a rank that had written ok once aborted there (SIGABRT from a C++ thread of its process group), and the
cell became an error."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import ROOT

# Runs the worker as `python -m bench.worker` does, with a teardown that aborts: an atexit handler stands in
# for the C++ destructor.
_RUN = """
import atexit, os, runpy, sys
atexit.register(os.abort)
sys.argv = ["bench.worker", "--prebuild", "NoSuchBuilder", "--report", sys.argv[1]]
runpy.run_module("bench.worker", run_name="__main__", alter_sys=True)
"""


def test_teardown_after_the_result_cannot_change_the_exit_code(tmp_path):
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-c", _RUN, str(report)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    # The prebuild of an op no accelerator has fails, and says so: exit code 1, as main() returned (without
    # the worker's own exit, the abort's -6).
    assert json.loads(report.read_text())["NoSuchBuilder"]["ok"] is False
    assert r.returncode == 1, (r.returncode, r.stdout[-1000:], r.stderr[-1000:])
