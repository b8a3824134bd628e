"""Benchmarks: `make bench` prints speed figures and ratios measured in one run. Never asserted in tests.

Importing this package puts the numeric kernel level in force (sera.numerics.pin) before any bench module imports
torch, as the studies' entry points do, so `python -m bench.<module>` times the kernels the runs use."""

from sera.numerics import pin

pin()
