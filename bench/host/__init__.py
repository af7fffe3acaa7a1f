"""This machine: versions and provenance, host memory, safe file access, the per-machine cache."""
