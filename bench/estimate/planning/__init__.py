"""The models put to use around a run: the `micro_batch: auto` search (search), the memory/speed frontier a plan
is predicted to have (frontier), and a prediction corrected by what a run has measured so far (online)."""
