"""Deployment: what the commands and an app's own worker run on.

Where a command's data lives (`where`: the URL, database and prefix rules), the embedded
server for when no URL is given (`embedded`, and `local_server`, the process manager that
lets commands share it), the opened stack of clients, store and transport (`stack`), loading
a directory of models (`loader`) and the scoped post-commit relay (`relay`). It sits above the
store, the transport and the read side, and below every command. This package's face is the public path of what an app's own
worker takes from it: `load_models` and the scoped relay (`ScopedStore`, `sweep`).
"""

from harel_beanie.deploy.loader import default_models_dir, load_models
from harel_beanie.deploy.relay import ScopedStore, sweep

__all__ = ["ScopedStore", "default_models_dir", "load_models", "sweep"]
