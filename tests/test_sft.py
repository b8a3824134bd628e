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
