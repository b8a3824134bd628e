"""The studies' entry points. Importing this package first puts the numeric kernel level (SERA_NUMERICS, see
sera.numerics) in force before torch loads, so every `python -m experiments...` run, and each torchrun worker, runs at
the level it records."""

from sera.numerics import pin

pin()
