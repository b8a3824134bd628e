"""Data for the classification-as-policy study: the embedded `digits1000` default and real ImageNet.

digits1000 (CPU default): scikit-learn's bundled 8x8 handwritten digits, three side by side, label = the 3-digit
number, so there are 1000 classes and p starts at 1/1000 as on ImageNet. The base images are split per digit
before composing, so validation composites only use images never seen in training.
gauss1000 (the CPU default in the paper's regime): 1000 classes, each a Gaussian in 64 dimensions around its own
centre (centres N(0, I), x = mu_y + 2 eps), generated from data.split_seed; with a zero-initialised output layer the
policy starts at p = 1/1000 for every image, as a ResNet-50 trained from scratch does on ImageNet.
imagenet: ImageFolder layout (`train/`, `val/` under data.root) with the paper's ResNet transforms.
Both yield batches (index (B,), x, y (B,)); the index identifies the example for the historical p_hat estimator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass
class InMemorySplit:
    """A split held as tensors: x (N, D) float32, y (N,) int64."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return self.y.numel()


GAUSS_DIM, GAUSS_NOISE = 64, 2.0  # gauss1000: input dimension and the noise around each class centre


def build_gauss1000(num_train: int, num_val: int, split_seed: int):
    """(train, val) splits of 1000 Gaussian classes: centres mu_c ~ N(0, I_64), x = mu_y + 2 eps, labels uniform.
    Train and val are independent draws of the same distribution (no example is in both)."""
    rng = np.random.default_rng(split_seed)
    centres = rng.standard_normal((1000, GAUSS_DIM)).astype(np.float32)

    def draw(num):
        labels = rng.integers(0, 1000, num)
        x = centres[labels] + GAUSS_NOISE * rng.standard_normal((num, GAUSS_DIM), dtype=np.float32)
        return InMemorySplit(torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64)))

    return draw(num_train), draw(num_val)


def build_digits1000(num_train: int, num_val: int, split_seed: int, val_fraction: float = 0.3):
    """Compose (train, val) splits of 1000-class three-digit images from scikit-learn's 8x8 digits."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # (1797, 8, 8)
    rng = np.random.default_rng(split_seed)
    train_pool, val_pool = [], []
    for d in range(10):
        idx = rng.permutation(np.flatnonzero(digits.target == d))
        cut = int(round(len(idx) * val_fraction))
        val_pool.append(idx[:cut])
        train_pool.append(idx[cut:])

    def compose(pools, num):
        labels = rng.integers(0, 1000, num)
        places = np.stack([labels // 100, labels // 10 % 10, labels % 10], axis=1)  # (num, 3) digits
        sizes = np.array([len(p) for p in pools])
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        slot = starts[places] + (rng.random(places.shape) * sizes[places]).astype(np.int64)
        picks = np.concatenate(pools)[slot]  # (num, 3) ids of random base images of each place's digit
        x = np.concatenate([images[picks[:, k]] for k in range(3)], axis=2)  # (num, 8, 24)
        return InMemorySplit(torch.from_numpy(x.reshape(num, -1)), torch.from_numpy(labels.astype(np.int64)))

    return compose(train_pool, num_train), compose(val_pool, num_val)


class BatchStream:
    """Shuffled epochs of example indices, resumable mid-epoch: state is (epoch, position).

    Each epoch's permutation comes from (seed, epoch), so a resumed run draws exactly the batches it would have
    drawn. Under DistributedDataParallel each rank takes every world-th batch. `make_iter(batches, epoch)` turns a
    list of the epoch's index batches into an iterator of (x, y) (a tensor gather in memory, a DataLoader for
    ImageFolder, whose augmentations are seeded by (seed, epoch, image), so a resumed run sees the same crops).
    """

    def __init__(self, num_examples: int, batch_size: int, seed: int, make_iter, rank: int = 0, world: int = 1):
        if batch_size * world > num_examples:
            raise ValueError(f"batch size {batch_size} x {world} ranks exceeds the {num_examples} training examples")
        self.num, self.batch_size, self.seed, self.make_iter = num_examples, batch_size, seed, make_iter
        self.rank, self.world = rank, world
        self.load_state_dict({"epoch": 0, "pos": 0})

    def _epoch_batches(self) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        perm = torch.randperm(self.num, generator=g)
        per_epoch = self.num // (self.batch_size * self.world)
        return [perm[(b * self.world + self.rank) * self.batch_size :][: self.batch_size] for b in range(per_epoch)]

    @property
    def steps_per_epoch(self) -> int:
        return len(self._batches)

    def next_batch(self):
        """(idx (B,), x, y (B,)) of the next batch."""
        if self.pos == len(self._batches):
            self.load_state_dict({"epoch": self.epoch + 1, "pos": 0})
        idx = self._batches[self.pos]
        self.pos += 1
        return (idx, *next(self._iter))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._batches = self._epoch_batches()
        self._iter = self.make_iter(self._batches[self.pos :], self.epoch)


def in_memory_batches(split: InMemorySplit):
    return lambda batches, epoch: ((split.x[idx], split.y[idx]) for idx in batches)


def in_memory_val_batches(split: InMemorySplit, batch_size: int = 2048):
    for start in range(0, len(split), batch_size):
        yield split.x[start : start + batch_size], split.y[start : start + batch_size]


def check_imagenet_root(root) -> Path:
    """Fail early with a clear message unless data.root holds ImageFolder `train/` and `val/` with class folders."""
    if root is None:
        raise ValueError("data.name=imagenet needs data.root=/path/to/imagenet (ImageFolder layout: train/, val/)")
    root = Path(root).expanduser()
    for split in ("train", "val"):
        folder = root / split
        if not folder.is_dir():
            raise FileNotFoundError(
                f"ImageNet split folder {folder} does not exist (expected {root}/train, {root}/val)"
            )
        if not any(p.is_dir() for p in folder.iterdir()):
            raise ValueError(f"{folder} holds no class folders: not an ImageFolder layout")
    return root


def imagenet_datasets(root):
    """The paper's ResNet-50 transforms: RandomResizedCrop(224) + flip for train, Resize(256) + CenterCrop(224)."""
    from torchvision import transforms as T

    root = check_imagenet_root(root)
    norm = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    val_tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm])
    from torchvision.datasets import ImageFolder

    return ImageFolder(str(root / "train"), train_tf), ImageFolder(str(root / "val"), val_tf)


def augmentation_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one image's augmentation in one epoch of a run: (seed, epoch, image) hashed to 32 bits, since
    torch's CPU generator keeps only a seed's low 32 bits (seeds 2**32 apart would give the same crops)."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1)[0])


class SeededImages(torch.utils.data.Dataset):
    """One epoch of an ImageFolder whose image i is augmented from torch's CPU generator (which torchvision's crops
    and flips draw from) seeded with `augmentation_seed(seed, epoch, i)`, inside fork_rng, so the caller's stream is
    untouched (`torch.manual_seed` would also reseed CUDA's). The crops then depend on (run seed, epoch, image)
    alone, not on which DataLoader worker decodes the image or on where a resume started; the seeds are made where
    the images are decoded, in the workers."""

    def __init__(self, dataset, seed: int, epoch: int):
        self.dataset, self.seed, self.epoch = dataset, seed, epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        index = int(index)
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(augmentation_seed(self.seed, self.epoch, index))
            return self.dataset[index]


def image_folder_batches(dataset, workers: int, seed: int):
    """An epoch's index batches as a DataLoader over the ImageFolder (workers decode ahead), each image augmented
    from its own seed (`SeededImages`)."""

    def make_iter(batches, epoch):
        images = SeededImages(dataset, seed, epoch)
        own = torch.Generator().manual_seed(epoch)  # the loader's worker base seed, not a draw from torch's RNG
        loader = torch.utils.data.DataLoader(
            images, batch_sampler=batches, num_workers=workers, pin_memory=torch.cuda.is_available(), generator=own
        )
        return iter(loader)

    return make_iter


def image_folder_val_batches(dataset, batch_size: int, workers: int):
    yield from torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers)
