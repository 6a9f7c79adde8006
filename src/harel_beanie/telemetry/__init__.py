"""Telemetry over a store: Prometheus figures (`metrics`) and the timing and tracing wrapper
(`instrument`). Both sit above the read side and the shells and change neither.
"""
