"""Scripts that use the suite as a library (SERA inside TRL). Importing this package first puts the numeric kernel
level (SERA_NUMERICS, see sera.numerics) in force before torch loads, as `experiments` does for the entry points."""

from sera.numerics import pin

pin()
