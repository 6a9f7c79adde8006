"""The operations side: the command line and each command (demo, worker, status, monitor,
prune, check-history), and what they run on: the URL/db/prefix rules (`where`), the opened
stack (`stack`), the embedded server, model loading, the runners' drivers, the history
checker's replay, the scoped relay and retention. It uses the store; the store never imports
it.
"""
