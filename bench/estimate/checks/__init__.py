"""The models against the records: the step-time model fitted and held out by results file (timecheck), its
printout (timetext), and both models held out by machine and by GPU model (heldout). The memory model's own check
is bench.estimate.check."""
