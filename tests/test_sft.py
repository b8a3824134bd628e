"""The base models' SFT stays on one device (sera.sft.one_device): transformers' Trainer would otherwise wrap the
model in nn.DataParallel over every visible GPU and multiply the batch. Only a multi-GPU host runs the real case;
here the Trainer's own arguments are built and their device count set as a multi-GPU host would set it."""

from types import SimpleNamespace

from sera.sft import one_device


def test_a_multi_gpu_device_count_is_capped_at_one():
    args = SimpleNamespace(device="cuda:0", _n_gpu=4)
    one_device(args)
    assert args._n_gpu == 1


def test_the_trainer_arguments_keep_their_count_on_the_cpu_and_train_per_device_batch():
    from trl import SFTConfig

    args = SFTConfig(output_dir="/tmp/sft-one-device", use_cpu=True, per_device_train_batch_size=32, report_to=[])
    one_device(args)
    assert args.n_gpu == 0 and args.train_batch_size == 32
    args._n_gpu = 3  # what _setup_devices sets on a host with three GPUs
    one_device(args)
    assert args.n_gpu == 1 and args.train_batch_size == 32  # not 3 x 32


def test_the_base_sft_trains_and_saves_under_the_installed_transformers(tmp_path):
    """sft_train builds TRL's config and trains under the installed transformers (5.24 here; 5.17, vLLM's pin, under
    `make test-vllm`, where the activation-checkpointing switch has its older name): the saved model loads back with
    the trained weights, which differ from the initial ones."""
    import torch

    from experiments.maze.model import build_model, build_tokenizer
    from experiments.maze.sft import sft_examples
    from sera.sft import sft_train

    torch.manual_seed(0)
    model = build_model("maze-tiny")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sft = SimpleNamespace(steps=2, batch_size=4, lr=1e-3, warmup_steps=0)
    loss = sft_train(model, build_tokenizer(), sft_examples(8, 7, 0), tmp_path, sft, 0, "cpu", False)
    assert loss == loss and loss > 0  # a finite, positive cross-entropy
    saved = build_model("maze-tiny", str(tmp_path)).state_dict()
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
