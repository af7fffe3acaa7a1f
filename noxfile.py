"""The front door: every job a person or CI runs is a session here.

nox -s bench                       # the embedded CPU smoke matrix, then its report
nox -s bench -- matrices/1b.yaml   # any matrix; arguments go to `zerobench run`
nox -s tests                       # CPU test suite, the quick part (unit tests, reports, checks)
nox -s slow_tests                  # CPU: real DeepSpeed cells end to end and the fault suite
nox -s ci                          # what CI runs after lint: both suites in one environment
nox -s ds_tables                   # after a DeepSpeed upgrade: regenerate bench/matrix/dsconfig_keys.json
nox -s regress -- BASELINE MATRIX  # run MATRIX, then compare it with BASELINE (fails on a regression)
"""

import contextlib
import os
import shutil
import time
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"

# CPU wheel of torch: CI and dev machines have no GPU, and the CUDA build is several GB.
TORCH_CPU = "torch==2.13.0"


def _cuda_host() -> bool:
    """An NVIDIA driver is loaded (no torch needed to tell)."""
    return Path("/proc/driver/nvidia/gpus").is_dir() or shutil.which("nvidia-smi") is not None


def _install(session, *extras):
    """The project with its extras; on a CUDA host also the GPU extra (NVML telemetry, bitsandbytes,
    Liger) and the registry's CUDA torch instead of the CPU build."""
    if _cuda_host():
        extras = (*extras, "gpu")
    else:
        session.install(TORCH_CPU)
    spec = ".[" + ",".join(extras) + "]" if extras else "."
    session.install("-e", spec)


def _system_packages(session):
    """The browser tests need a Chromium, the NVMe tests libaio's headers (DeepSpeed's async-I/O op compiles
    against them) and the Slurm tests Slurm's daemons and munge (tests/slurm_cluster.py starts a cluster of
    them); none is a Python package. Installed with Debian's packages when missing and we are root, else the
    session stops before any test with the one command to run."""
    missing = []
    if not (os.environ.get("ZEROBENCH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")):
        missing.append("chromium")
    if not Path("/usr/include/libaio.h").exists():
        missing.append("libaio-dev")
    if not all(shutil.which(b) or Path("/usr/sbin", b).exists() for b in ("slurmctld", "slurmd", "sbatch")):
        missing.append("slurm-wlm")
    if not (shutil.which("munged") or Path("/usr/sbin/munged").exists()):
        missing.append("munge")
    if not missing:
        return
    if shutil.which("apt-get") and os.geteuid() == 0:
        session.log(f"installing Debian's {' '.join(missing)} (for the browser, NVMe and Slurm tests)")
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        session.run("apt-get", "update", "-qq", external=True, env=env)
        session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, external=True, env=env)
        return
    session.error(
        f"the browser, NVMe and Slurm tests need {' and '.join(missing)}, which are not Python packages: run "
        f"`sudo apt-get install -y {' '.join(missing)}` (Debian/Ubuntu; elsewhere your system's "
        "Chromium, libaio development package, Slurm and munge), then `nox -s tests` again"
    )


QUICK = "not gpu and not slow"
SLOW = "slow and not gpu"


ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1"}
"""numpy's BLAS (the fits, the answer simulator) one thread per test process: two test files run at once on the
2-core CI machine, where a second BLAS thread only contends with the other file (docs/testing.md). Torch's threads,
which the CPU cells use, are not BLAS's."""


def _quick_suite(session, *extra):
    """Two at a time, one file per pytest-xdist worker (as the slow suite): on the 2-core CI machine the
    quick suite took 957 s in one process and 298 s so (docs/testing.md)."""
    session.run("pytest", "-m", QUICK, "-n", "2", "--dist", "loadfile", *extra, *session.posargs, env=ONE_BLAS_THREAD)


COPIED_OPS = ("CPUAdamBuilder", "ShareMemCommBuilder")
"""The DeepSpeed ops the copies_ops tests' cells load (the ZeRO-Offload CPU Adam; the CPU's shared-memory
collectives, which every CPU cell's init_distributed loads)."""


def _slow_suite(session, *extra):
    """The ops the copies_ops tests copy built, then the `serial` slow tests alone (they time something), then
    the `copies_ops` ones two at a time (nothing builds into the folder they copy beside them), then the rest two
    at a time, one file per pytest-xdist worker: most of a slow test's time is its cells' start-up in child
    processes, which a second worker overlaps. Exit code 5 (nothing selected) is fine: arguments may pick tests
    of only one part."""
    two = ("-n", "2", "--dist", "loadfile")
    # The ops the copies_ops tests copy, built first into the machine's folder (seconds where built), as the
    # tests' CPU cells build them (CUDA hidden): a test that copies the folder before they are built compiles them
    # in its copy, for itself alone. A failed build is left to the tests that need the op to report.
    hidden = {"CUDA_VISIBLE_DEVICES": "", "ZEROBENCH_NO_GPU": "1"}
    with _timed(session, "slow suite, ops the copies_ops tests load"):
        session.run("python", "-m", "bench.worker", "--prebuild", *COPIED_OPS, env=hidden, success_codes=[0, 1])
    for name, marks, workers in (
        ("serial part", f"{SLOW} and serial", ()),
        ("copies_ops part", f"{SLOW} and copies_ops and not serial", two),
        ("the rest", f"{SLOW} and not serial and not copies_ops", two),
    ):
        with _timed(session, f"slow suite, {name}"):
            args = ("-m", marks, *workers, *extra, *session.posargs)
            session.run("pytest", *args, success_codes=[0, 5], env=ONE_BLAS_THREAD)


@contextlib.contextmanager
def _timed(session, what: str):
    """Log `ci: <what> took N s` after the block: every CI log says where its time went."""
    t0 = time.monotonic()
    yield
    session.log(f"ci: {what} took {time.monotonic() - t0:.0f} s")


@nox.session(python="3.11")
def tests(session):
    """Run the quick CPU suite: everything but the `slow` tests (real DeepSpeed cells end to end, the fault
    suite) and the GPU ones. `nox -s slow_tests` runs the slow ones; `nox -s ci` runs both."""
    _system_packages(session)
    _install(session, "test")
    _quick_suite(session)


@nox.session(python="3.11")
def slow_tests(session):
    """Run the slow CPU tests: real tiny DeepSpeed cells through every path, and the fault suite."""
    _system_packages(session)
    _install(session, "test")
    _slow_suite(session)


@nox.session(python="3.11")
def ci(session):
    """Run what CI runs after lint: the quick suite, then the slow one, in one environment (torch, DeepSpeed
    and the rest installed once, not once per suite)."""
    # Each phase's wall time, and the slowest tests' (--durations), in every CI log: a slow CI says where.
    with _timed(session, "system packages"):
        _system_packages(session)
    with _timed(session, "install"):
        _install(session, "test")
    with _timed(session, "quick suite"):
        _quick_suite(session, "--durations=30")
    with _timed(session, "slow suite"):
        _slow_suite(session, "--durations=30")


@nox.session(python="3.11")
def faults(session):
    """Run the fault suite and print its summary (`-- --md PATH` also writes it)."""
    _system_packages(session)
    _install(session, "test")
    session.run("python", "-m", "tests.faults", *session.posargs)


@nox.session(python="3.11")
def lint(session):
    """ruff (lint, and the format check) and the import-layer contracts (lint-imports, pyproject.toml)."""
    session.install("ruff==0.17.6", "import-linter==2.17")  # pinned: lint results must not move with a release
    paths = ["bench", "tests", "tools", "noxfile.py"]
    session.run("ruff", "check", *paths, *session.posargs)
    session.run("ruff", "format", "--check", *paths)
    # lint-imports reads the package from the source tree; nothing to install.
    session.run("lint-imports", env={"PYTHONPATH": str(Path(__file__).resolve().parent)})


@nox.session(python="3.11")
def ds_tables(session):
    """Regenerate bench/matrix/dsconfig_keys.json from the pinned DeepSpeed's config models (`-- --check`: compare
    only)."""
    _install(session)
    session.run("python", "-m", "bench.matrix.dsconfig_gen", *session.posargs)


@nox.session(python=False)
def gpu_tests(session):
    """Run the GPU-marked tests in the current environment (on a CUDA host)."""
    session.run("python", "-m", "pytest", "-m", "gpu", "-v", *session.posargs)


@nox.session(python="3.11")
def bench(session):
    """Run a matrix (default: the embedded CPU smoke matrix) into the git-ignored results/local/, and its reports."""
    _install(session)
    session.run("zerobench", "run", *session.posargs)


@nox.session(python="3.11")
def report(session):
    """Write Markdown and HTML reports from results files (default: every file in results/)."""
    _install(session)
    import glob

    args = session.posargs or sorted(glob.glob("results/*.jsonl"))
    session.run("zerobench", "report", *args)


@nox.session(python="3.11")
def regress(session):
    """Run a matrix, then compare it with a baseline results file; fails on a regression (`-- BASELINE MATRIX`)."""
    if len(session.posargs) < 2:
        session.error("usage: nox -s regress -- BASELINE.jsonl MATRIX.yaml [more `zerobench run` arguments]")
    baseline, matrix, *extra = session.posargs
    _install(session)
    stem = Path(matrix).stem
    results = Path("results") / "regress" / f"{stem}.jsonl"
    results.unlink(missing_ok=True)  # a fresh measurement, never mixed with an earlier one
    session.run("zerobench", "run", matrix, "--results", str(results), "--no-report", "--no-progress", *extra)
    # Exit 1 on a regression, or 3 when it compared too little, fails the session (and the CI job); the Markdown
    # is written either way.
    session.run("zerobench", "compare", baseline, str(results), "--md", str(Path("reports") / f"regress-{stem}.md"))
