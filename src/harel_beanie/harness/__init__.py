"""The test and bench harness: harel's own runners driving a script of steps on any store
(`drivers`), on a clock that moves only when told, and what a store holds at the end of a run
(`snapshots`), read the same way from any store so runs on different stores compare.
"""
