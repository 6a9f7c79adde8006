"""The commands of `harel-beanie`, one module each, named as its command (`migrate_transport`
runs `migrate-transport`, `check_history` runs `check-history`), each with its flags beside its
`main`; `cli` lists them and is the entry point. The top layer: nothing imports it.
"""
