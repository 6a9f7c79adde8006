# One command per job, each creating its own virtual environment (.venv) on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup docs demo dist test test-sharded soak reliability reliability-soak bench typecheck clean browser netfaults screenshots format bench-partitions bench-scale bench-group-commit bench-claim bench-cas-forms bench-cost

# what `make test` checks first: the formatter and the linter (ruff), applied
format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

# the manual (mkdocs.yml, docs/), served at http://127.0.0.1:8000 while you edit it; `make test`
# builds it with --strict, so a broken link or an API reference to a moved path fails there.
# (The variable silences mkdocs-material's banner about its successor.)
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs
docs: $(STAMP)
	$(MKDOCS) serve

# the main job: run the statechart workloads in models/ on the store (embedded server
# unless MONGODB_URL is set). It installs only what the demo and the dashboard need (the
# package with its server and dashboard extras), not the test tools; `make test` adds them.
DEMO_STAMP := $(VENV)/.installed-demo
$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[server,dashboard]"
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/harel-beanie demo

# the wheel a pip user installs until a release is published: dist/harel_beanie-*.whl, then
#   pip install 'dist/harel_beanie-<version>-py3-none-any.whl[server,dashboard]'
dist:
	rm -rf dist
	$(PY) -m pip wheel -q --no-deps -w dist .
	@ls dist/*.whl

# the browser tests drive Debian's chromium through chromedriver; no browser is downloaded by a
# tool. Installed with apt-get when missing (sudo when not root).
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; else \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium chromium-driver; fi

# the network-fault tests make namespaces, veth pairs and nft rules with Debian's iproute2
# and nftables: installed with apt-get when missing (as root; without root they fall back to
# loopback and need neither)
netfaults:
	@if [ "$$(id -u)" != 0 ] || { command -v ip && command -v nft; } >/dev/null; then :; else \
		apt-get update -q && apt-get install -y -q iproute2 nftables; fi

# test files spread over this many processes (pytest-xdist), each file whole in one of them
# (a module's fixtures, such as a demo run the browser tests share, are made once), and the
# modules that start several processes each run one after another in one of them
# (tests/conftest.py: SERIAL, its scheduler); each process starts its own embedded server.
# The suite mostly waits on servers, browsers, child processes and leases running out, so on
# a 2-core machine three processes beat two: 13-19 min of pytest against 22 min 42 s
# (2026-12-06, fresh clones, docs/testing.md).
TEST_PROCESSES ?= 3

# the whole default test suite, type check included, on a real wire-protocol server; the
# slowest 25 tests are printed at the end, so a CI log shows where the 15-minute budget goes
test: $(STAMP) browser netfaults
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python -m mypy
	$(BIN)/python -m mypy -p bench
	$(BIN)/lint-imports
	$(MKDOCS) build --strict --site-dir site
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --durations=25

# the opt-in run on a real sharded cluster, through its mongos (tests/sharding; without the
# variable its cluster tests are skipped, as in `make test`):
#   MONGODB_SHARDED_URL=mongodb://mongos:27017 make test-sharded
test-sharded: $(STAMP)
	@if [ -z "$$MONGODB_SHARDED_URL" ]; then \
		echo "set MONGODB_SHARDED_URL to a mongos: MONGODB_SHARDED_URL=mongodb://mongos:27017 make test-sharded"; \
		exit 2; fi
	MONGODB_SHARDED_URL="$$MONGODB_SHARDED_URL" $(BIN)/python -m pytest tests/sharding -q

# the long soaks (crash loops, large fuzz budgets)
soak: $(STAMP) netfaults
	$(BIN)/python -m pytest -q -m soak

# screenshots of the dashboard's main pages into docs/ (a demo run, the standalone dashboard,
# headless chromium)
screenshots: $(STAMP) browser
	$(BIN)/python docs/screenshots.py

# the reliability tests with their figures recorded, then docs/RELIABILITY.md regenerated; run at
# a commit (refused while src/ or tests/ have uncommitted changes: the page names the commit)
reliability: $(STAMP) netfaults
	$(BIN)/python docs/reliability.py

reliability-soak: $(STAMP) netfaults
	$(BIN)/python docs/reliability.py --soak

# the benchmarks, by what they measure (bench/__init__.py): each writes its own section of
# bench/RESULTS.md. The store and the stack beside harel's, in one run (bench/store, bench/stack)
bench: $(STAMP)
	$(BIN)/python -m bench.store.run

# a claim with 10,000 groups queued, and that backlog drained by one worker (bench/stack)
bench-claim: $(STAMP)
	$(BIN)/python -m bench.stack.claim_backlog

# what one event costs each stack, by command and kind of work, at concurrency 1, 16 and 64, with
# the floor (one commit, one publish) beside it: its own section of bench/RESULTS.md (bench/stack);
# `make bench` and `make bench-partitions` write the same table from their own runs
bench-cost: $(STAMP)
	$(BIN)/python -m bench.stack.cost --out bench/RESULTS.md

# would group commit win? the same commits as one bulk write and one update each (bench/store)
bench-group-commit: $(STAMP)
	$(BIN)/python -m bench.store.group_commit

# a commit's compare-and-set in the filter (as the store sends it) or inside a pipeline update by
# `_id`: what the filter's checks cost on the embedded server (bench/store)
bench-cas-forms: $(STAMP)
	$(BIN)/python -m bench.store.cas_forms

# scale-out figures for partitions (work per operation, events/s per worker count, takeover
# after a SIGKILL): its own section of bench/RESULTS.md, the rest of the file kept
bench-partitions: $(STAMP)
	$(BIN)/python -m bench.partitions.run

# time against size for every operation, at 10,000 / 100,000 / 1,000,000 stored executions
# (SIZES=10000,100000 for fewer): its own section of bench/RESULTS.md and docs/scale.png;
# MONGODB_URL adds that server. The embedded server keeps its data on disk in SCALE_DATA: in
# memory it held 3.6 GB at 100,000 executions. The data's shape: SHARES (the roots' kinds, as
# weights) and WAIT_DAYS (how far ahead the waiting executions' timers are, and how long ago
# their last update), bench/scale/seed.py says more.
SIZES ?= 10000,100000,1000000
SHARES ?= finished=90,timer=8,failed=1,outbox=1
WAIT_DAYS ?= 30
SCALE_DATA ?= harel-beanie-scale-data
bench-scale: $(STAMP)
	rm -rf $(SCALE_DATA)
	$(BIN)/python -m bench.scale.run --sizes $(SIZES) --shares $(SHARES) --wait-days $(WAIT_DAYS) --storage $(SCALE_DATA)
	rm -rf $(SCALE_DATA)

clean:
	rm -rf $(VENV) harel-beanie-data dist
