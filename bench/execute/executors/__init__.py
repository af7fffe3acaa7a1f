"""Where and when cell attempts run: the protocol every executor implements (executor), the executors (local: cells
packed on one host's GPUs; ray: as Ray tasks on a cluster; slurm: one Slurm job per attempt; replay: recorded ends
served, nothing runs) and their names (registry). Each runs an attempt's job through the one child protocol
(bench.execute.launch); the session (bench.execute.session) writes every record."""
