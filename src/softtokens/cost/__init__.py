"""The bill: what a grid will cost before it runs (``forecast``, from the measured rates of rates/) and
what each job, cell and table did cost (``ledger``, from Snakemake's benchmark files).

Why a room of its own: "what did it cost" is one of the three things a user comes for; the forecast and
the ledger are held against each other."""
