"""zerobench: a benchmarking and ablation harness for memory-efficient LLM training.

The orchestrator modules (matrix, cells, rules, dsconfig, launch, store, run, results, report) import
no torch; the worker package (bench.worker) does, in its own process.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
