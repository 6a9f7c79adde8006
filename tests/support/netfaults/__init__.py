"""The network-fault runs of tests/reliability/test_reliability_network.py: layers, proxy, faults, runs, scenarios."""
