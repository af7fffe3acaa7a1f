"""zerobench: a benchmarking and ablation harness for memory-efficient LLM training.

The orchestrator's stages (cli, matrix, estimate, execute, records, judge, report, host: docs/architecture.md)
import no torch; the worker package (bench.worker) does, in its own process.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
