"""The store's document classes before Beanie has bound them, and the one line they then say.

Why this module exists: Beanie binds a document class to a database in `init_beanie`; until
then a typed query fails as far from its cause as can be: `ExecutionDocument.status` is an
`AttributeError: status`, and `ExecutionDocument.find({...})` raises
`CollectionWasNotInitialized` with no message. An app meets that when it queries before
anything set the store up (a store built on its own client and not yet used). `StoreDocument`,
the base of the store's documents, turns both into one line naming what to run. Once the
class is bound, neither path is taken: Beanie sets the fields on the class and its settings.
"""

from __future__ import annotations

from typing import Any

from beanie import Document
from beanie.exceptions import CollectionWasNotInitialized


def not_bound(cls: type) -> str:
    """What an unbound document class says: how each way of opening the store binds it."""
    return (
        f"{cls.__name__} is not bound to a database yet: run `await store.init()` on the store first "
        "(`await AsyncMongoStore.from_url(...)` binds it itself), or list it in your own "
        "init_beanie(document_models=[..., *DOCUMENT_MODELS])"
    )


# pydantic's metaclass, extended: only a missing attribute that is one of the model's fields
# gets the message; everything else is pydantic's own answer
_ModelMeta: Any = type(Document)


class _Meta(_ModelMeta):  # type: ignore[misc,valid-type]
    def __getattr__(cls, item: str) -> Any:
        try:
            return super().__getattr__(item)
        except AttributeError:
            fields = cls.__dict__.get("__pydantic_fields__") or {}
            if item in fields:
                raise AttributeError(f"{item}: {not_bound(cls)}") from None
            raise


class StoreDocument(Document, metaclass=_Meta):
    """A Beanie `Document` whose use before `init_beanie` names `store.init()`."""

    @classmethod
    def get_settings(cls) -> Any:
        try:
            return super().get_settings()
        except CollectionWasNotInitialized:
            raise CollectionWasNotInitialized(not_bound(cls)) from None
