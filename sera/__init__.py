"""SERA: Scale-Equalized Rollout Allocation for maximum-likelihood RL - the paper's mathematics and shared machinery.

The math modules (allocation, estimation, advantages, methods, passk, stats, sequential) are pure numpy and never
import torch: `pip install .` installs them with numpy and scipy alone (docs/allocator.md; tests/test_core_install.py
guards it). The torch pieces (losses, runlog, and the language-model machinery) come with the `studies` and `trl`
extras and are imported explicitly by those who need them.
"""

__version__ = "0.1.0"
