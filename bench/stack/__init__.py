"""The production stack beside harel's: transports, round trips per message, latency, timer lateness (run inside `make bench`)."""
