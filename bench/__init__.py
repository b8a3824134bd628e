"""Benchmarks: `make bench` prints speed figures and ratios measured in one run. Never asserted in tests."""
