"""The bottom layer, which every other imports: the config and its schema (the one home of the
paper's hyper-parameters), the words modes and settings are spelled with, every result path,
the jobs of a grid for the workflow, provenance and atomic file writes. It imports no other
layer of the package."""
