"""The network-fault runs of tests/test_reliability_network.py: layers, proxy, faults, runs, scenarios."""
