"""Sharded clusters: the shard plan's check, the `shard` command, the classifier of where a
recorded command goes (`targeting.py`), and the opt-in run on a real cluster."""
