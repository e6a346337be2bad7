"""The config: config.yaml's grids checked against the schema (the one home of the paper's hyper-parameters, as the
schema's defaults), the words modes and settings are spelled with, the YAML text and where each key is written, each
cell's resolved settings, the readings of what the paper does not say, and a grid's sweep expanded into training
cells. The lowest room: it imports no other room of the package."""
