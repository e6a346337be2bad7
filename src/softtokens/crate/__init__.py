"""A result and everything it rests on as a Workflow Run RO-Crate (the Provenance Run Crate profile), made from the
jobs' records (``build``), and checked wherever it lands (``check``): provenance anyone can read, without this
project. Above the audit (it checks a crate with the audit's own checks), below the report."""
