"""Time against the number of stored executions, 10,000 to a million (`make bench-scale`)."""
