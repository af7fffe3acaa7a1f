"""Describe and judge a cell before anything runs: the matrix file, axes, presets, cells, rules, DeepSpeed configs."""
