"""Deployment: what the commands and an app's own worker run on.

Where a command's data lives (`where`: the URL, database and prefix rules), the embedded
server for when no URL is given (`embedded`, and `local_server`, the process manager that
lets commands share it), the opened stack of clients, store and transport (`stack`), loading
a directory of models (`loader`), the scoped post-commit relay (`relay`), the private seam of
harel's worker it leans on (`seam`) and the worker an app runs in its own process (`worker`).
It sits above the store, the transport and the read side, and below every command. This
package's face is the public path of what an app's own worker takes from it: `Worker` (what
`harel-beanie worker` runs), `load_models` and the scoped relay (`ScopedStore`, `sweep`).
"""

from harel_beanie.deploy.loader import default_models_dir, load_models
from harel_beanie.deploy.relay import ScopedStore, sweep
from harel_beanie.deploy.seam import HarelSeamChanged
from harel_beanie.deploy.worker import Worker

__all__ = ["HarelSeamChanged", "ScopedStore", "Worker", "default_models_dir", "load_models", "sweep"]
