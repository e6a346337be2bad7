"""The result store: every path of the results layout, atomic writes and hashes, provenance records (where a record
lives, its root, what it names), and what an evaluation file says it is. Above config (a path is spelled with its
words), below everything that reads or writes a result."""
