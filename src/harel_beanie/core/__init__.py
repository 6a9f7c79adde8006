"""The store's core: what is stored and what every store operation does, free of I/O.

The schema (`documents`), what a commit writes (`commit`, `sizes`, `seqs`), how a stored
document reads back as harel's records (`records`, `listing`), how caller strings become
keys (`keys`), and each operation written once as a generator of typed calls (`calls`,
`flows/`) that `harel_beanie.store.dispatch` runs for both store shells. Nothing here imports a shell, the
operations side or the dashboard; the import contracts in pyproject.toml hold it to that.
"""
