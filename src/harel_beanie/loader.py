"""Loading a directory of `*.stm` models (`load_models`), as the commands, the tests and the
benchmark do. It lives in `harel_beanie.deploy.loader`; this module is the public path to it.
"""

from harel_beanie.deploy.loader import (
    default_models_dir,
    load_models,
)

__all__ = [
    "default_models_dir",
    "load_models",
]
