"""tests/vllm runs in .venv-vllm (`make test-vllm`); where vLLM does not import (the main .venv, `make test`) pytest
does not collect it."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["test_*.py"]
