"""The trainer group's parallel layout as plain numbers (``dims.ParallelDims``), torch-free, so that the config,
the memory plan, placement and the plugins all read one type."""
