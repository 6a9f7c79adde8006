"""The store beside harel's MongoStore: events/s through harel's runners, what each commit kind and index costs, group commit (`make bench`, `make bench-group-commit`)."""
