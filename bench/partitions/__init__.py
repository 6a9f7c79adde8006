"""Scale-out with partitions: work per background operation, events/s per worker count, takeover (`make bench-partitions`)."""
