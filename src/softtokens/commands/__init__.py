"""The commands of `python -m softtokens`, one module per stage (data, train, evaluate, report,
gpu). Each takes the resolved settings of its DAG node as JSON (``--settings``) and explicit
input and output paths, writes its outputs atomically and stamps them with provenance. No
command holds a default of the method: a missing setting is an error naming the key."""
