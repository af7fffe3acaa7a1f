"""What a cell trains, built in the worker: the model (models), its data (data), and the optimizer its engine
built, checked against the one the cell names (optimizer)."""
