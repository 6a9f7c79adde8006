"""What the benchmarks share: the workload and stores, the wire tally, the marked sections of RESULTS.md."""
