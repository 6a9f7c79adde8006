"""The benchmarks, one folder per thing they measure, each run as a module from the
repository's top by one make target and writing its own section of bench/RESULTS.md:

- `bench.store`: the store beside harel's MongoStore (`make bench`), and whether a group
  commit would win (`make bench-group-commit`);
- `bench.stack`: the production stack beside harel's, measured in `make bench`'s run (ratios
  mean something only inside one run);
- `bench.partitions`: scale-out with partitions (`make bench-partitions`);
- `bench.scale`: time against the number of stored executions (`make bench-scale`);
- `bench.common`: what they share.

docs/CONTRIBUTING.md ("Benchmark") says what each module holds.
"""
