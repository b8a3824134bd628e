"""tests/gpu runs on a CUDA machine (`make test-gpu`); where torch sees no GPU (`make test`, CI) pytest does not
collect it."""

import torch

collect_ignore_glob = [] if torch.cuda.is_available() else ["test_*.py"]
