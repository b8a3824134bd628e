"""SERA: Scale-Equalized Rollout Allocation for maximum-likelihood RL - the paper's mathematics and shared machinery.

The math modules (allocation, estimation, advantages, methods, passk, stats) are pure numpy and never import torch;
the torch pieces (losses, runlog, and the language-model machinery) are imported explicitly by those who need them.
"""

__version__ = "0.1.0"
