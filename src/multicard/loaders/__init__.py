"""Data loaders behind one signature: `LOADERS[name](config) -> Loader`.

The training loop never knows which loader it has. `epoch()` yields each batch as the loader's
`next()` produces it (on the host for the DataLoader, on the device for DALI and synthetic), and
`to_device(batch)` finishes it on the training device, so the loop can time the wait for the
loader and the wait for the copy apart. A finished batch is `(images, labels, indices)`: images
(B, 3, N, N) in the requested memory format, float32 unless `host_dtype` asks the loader for the
precision's dtype before the copy (`cast = "host"`), labels int64, and the dataset indices of the
samples (so tests and audits can see exactly which samples a rank saw).

Every loader draws the same samples (`sample_indices`), trimmed to a multiple of the world size,
so all ranks take the same number of equally sized steps: DALI's shards never end in an empty
batch and the DistributedSampler never pads with repeated samples.

- `torch`: PyTorch DataLoader + DistributedSampler; decoding and normalisation in CPU worker
  processes (the paper's setup); host-to-device copy with non_blocking, timed with CUDA events.
- `dali`: NVIDIA DALI, Scenario B files; decoding and normalisation on the GPU ("mixed" decoder),
  CPU operators on a CPU-only machine.
- `synthetic`: one fixed batch resident on the device: the bound where loading costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from multicard.loaders.interface import Batch, Loader, LoaderConfig, sample_indices

__all__ = ["LOADERS", "Batch", "Loader", "LoaderConfig", "sample_indices"]


def make_torch(config: LoaderConfig) -> Loader:
    from multicard.loaders.torch_loader import TorchLoader

    return TorchLoader(config)


def make_dali(config: LoaderConfig) -> Loader:
    from multicard.loaders.dali_loader import DaliLoader

    return DaliLoader(config)


def make_synthetic(config: LoaderConfig) -> Loader:
    from multicard.loaders.synthetic import SyntheticLoader

    return SyntheticLoader(config)


LOADERS: dict[str, Callable[[LoaderConfig], Loader]] = {
    "torch": make_torch,
    "dali": make_dali,
    "synthetic": make_synthetic,
}
