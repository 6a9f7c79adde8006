"""Keeping harel 0.9's post-commit relay to the handled execution, and sweeping leftovers with
each owner's own definition, for apps that build their own worker. It lives in
`harel_beanie.deploy.relay`; this module is the public path to it.
"""

from harel_beanie.deploy.relay import (
    ScopedStore,
    sweep,
)

__all__ = [
    "ScopedStore",
    "sweep",
]
