"""The front door: every job a person or CI runs is a session here.

    nox -s bench                       # the embedded CPU smoke matrix, then its report
    nox -s bench -- matrices/1b.yaml   # any matrix; arguments go to `zerobench run`
    nox -s tests                       # CPU test suite (what CI runs)
"""
import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"

# CPU wheel of torch: CI and dev machines have no GPU, and the CUDA build is several GB.
TORCH_CPU = "torch==2.13.0"


def _install(session, *extras):
    session.install(TORCH_CPU)
    spec = ".[" + ",".join(extras) + "]" if extras else "."
    session.install("-e", spec)


@nox.session(python="3.11")
def tests(session):
    """Run the CPU test suite (real tiny DeepSpeed cells included); GPU tests skip."""
    _install(session, "test")
    session.run("pytest", "-m", "not gpu", *session.posargs)


@nox.session(python=False)
def gpu_tests(session):
    """Run the GPU-marked tests in the current environment (on a CUDA host)."""
    session.run("python", "-m", "pytest", "-m", "gpu", "-v", *session.posargs)


@nox.session(python="3.11")
def bench(session):
    """Run a matrix (default: the embedded CPU smoke matrix) and write its reports."""
    _install(session)
    session.run("zerobench", "run", *session.posargs)


@nox.session(python="3.11")
def report(session):
    """Write Markdown and HTML reports from results files (default: every file in results/)."""
    _install(session)
    import glob

    args = session.posargs or sorted(glob.glob("results/*.jsonl"))
    session.run("zerobench", "report", *args)
