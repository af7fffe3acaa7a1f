"""A stand-in for bitsandbytes on a CPU host, for tests only (a test puts this folder's parent first on the
worker's PYTHONPATH): its optimizers are torch's AdamW under bitsandbytes' names, with the attributes zerobench's
optimizer check reads. No kernels, no quantization: nothing here measures bitsandbytes."""

__version__ = "0.50.2"

from tests.fake_bnb.bitsandbytes import optim  # noqa: E402,F401 - bitsandbytes.optim after `import bitsandbytes`, as the real package
