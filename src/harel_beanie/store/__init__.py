"""The two store shells, `MongoStore` (PyMongo sync) and `AsyncMongoStore` (PyMongo async),
with their settings and connection rules.

Each shell only makes the calls the core's flows yield; what they share beyond that
(settings, concerns, waiting for a server) is in `settings` and `connect`.
"""
