"""The `dali` loader: NVIDIA DALI over the Scenario B files.

Per rank, `fn.readers.file` reads its shard (`shard_id` = rank, `num_shards` = world; shards are
disjoint and rotate every epoch), shuffles within DALI's buffer (`random_shuffle`), and pads the
shard (`pad_last_batch`) so that every rank runs the same number of batches. Decoding uses the
"mixed" backend (nvJPEG on the GPU), and `crop_mirror_normalize` normalises on the GPU with the
same MNIST mean/std as the DataLoader, writing CHW or HWC directly. The iterator's last-batch
policy is PARTIAL: the last batch is short and carries no padding, like the DataLoader's
`drop_last=False`. The file list is trimmed to a multiple of the world size first, so the shards
are equal and no rank's last batch is empty. The first batch is made at the first `next()`, in
the timed epoch, as the DataLoader's is (`prepare_first_batch=False`). On a CPU-only machine the
same pipeline runs with CPU operators (`device_id=None`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from multicard.data.mnist import MEAN, STD
from multicard.loaders.datasets import checked_tree
from multicard.loaders.interface import Batch, LoaderConfig, sample_indices


class DaliLoader:
    pin_memory = False  # DALI moves encoded bytes to the GPU itself

    def __init__(self, config: LoaderConfig) -> None:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        tree = checked_tree(config)
        self.config = config
        self.cuda = config.device.type == "cuda"
        lines = [line for line in (tree / f"{config.split}_index.txt").read_text().split("\n") if line]
        # a multiple of the world size: equal shards, so no rank's last batch is empty
        chosen = sample_indices(len(lines), config.subset, config.epoch_samples, config.seed,
                                config.world)
        files = [lines[i].rsplit(" ", 1)[0] for i in chosen]
        labels_by_index = np.load(tree / f"labels_{config.split}.npy").astype(np.int64)
        self.labels_by_index = torch.from_numpy(labels_by_index).to(config.device)
        pipe = _pipeline(
            batch_size=config.batch_size, num_threads=config.dali_threads,
            device_id=config.device.index if self.cuda else None, seed=config.seed,
            root=str(tree), files=files, indices=chosen.tolist(), rank=config.rank,
            world=config.world, decoder="mixed" if self.cuda else "cpu",
            layout="HWC" if config.layout == "nhwc" else "CHW",
            set_affinity=config.dali_affinity and self.cuda,
        )
        pipe.build()
        # prepare_first_batch=False: by default the iterator runs the pipeline for the first
        # batch here, before the clock, while the DataLoader's first batch (worker start-up
        # included) is timed inside epoch 0. Now both make it at the first next().
        self.iterator = DALIGenericIterator(
            [pipe], ["images", "index"], reader_name="Reader",
            last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True, prepare_first_batch=False)
        self.steps_per_epoch = len(self.iterator)
        self.samples_per_rank = len(files) // config.world  # equal shards (trimmed above)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        # Running to the end of the iterator is what resets it (auto_reset) for the next epoch.
        for outputs in self.iterator:
            images = outputs[0]["images"]
            if self.config.layout == "nhwc":
                images = images.permute(0, 3, 1, 2)  # an NCHW view with channels_last strides
            # On CUDA the indices come out of the pipeline on the GPU: a blocking copy of a CPU
            # output here would wait for the queued training step and charge it to data wait.
            indices = outputs[0]["index"].squeeze(-1).to(torch.int64)
            yield images, self.labels_by_index[indices], indices

    def to_device(self, batch: Batch) -> Batch:
        return batch  # made on the device (on the CPU in a CPU run)

    def dead_workers(self) -> list[tuple[int, int]]:
        return []  # no worker processes

    def h2d_seconds(self) -> float | None:
        return None  # the copy of the encoded bytes happens inside DALI's decoder


def _pipeline(batch_size: int, num_threads: int, device_id: int | None, seed: int, root: str,
              files: list[str], indices: list[int], rank: int, world: int, decoder: str,
              layout: str, set_affinity: bool) -> Any:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed,
                  set_affinity=set_affinity)
    def scenario_b() -> tuple[Any, Any]:
        # The "label" of each file is its dataset index; the class is looked up from it.
        encoded, index = fn.readers.file(
            file_root=root, files=files, labels=indices, shard_id=rank, num_shards=world,
            random_shuffle=True, pad_last_batch=True, seed=seed, name="Reader")
        images = fn.decoders.image(encoded, device=decoder, output_type=types.RGB)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout=layout,
            mean=[MEAN * 255.0] * 3, std=[STD * 255.0] * 3)
        return images, index.gpu() if decoder == "mixed" else index

    return scenario_b()
