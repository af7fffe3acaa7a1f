"""This machine: versions and provenance, host memory, safe file access, a heartbeat while helpers run."""
