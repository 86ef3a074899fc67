"""data.decode=gpu: training JPEGs decoded by nvJPEG and augmented as a batch on the GPU, in two
halves. Loader workers (EncodedTrain) read the files, check their headers and make the batch's
random draws from the sizes the headers declare, under the loader's seeded RNG; they hand over
the encoded bytes. The main process (DeviceDecode, wrapping the train loader) decodes each batch
in one nvJPEG call, cuts and resizes the crops and normalizes, on the device. File reads and
header checks overlap the training steps, and a resume draws what the uninterrupted run drew.

Bad samples, as on the CPU path, are dropped and counted (the batch's third element): a file
that cannot be read, whose header names no image or more than data.max_image_pixels, or that
nvJPEG cannot decode (a failed batch is decoded image by image to find it)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch.utils.data import Dataset
from torchvision.io import ImageReadMode, decode_jpeg

from turbotrain.core.schema import ConfigError
from turbotrain.data.batched import BatchPipeline
from turbotrain.data.decode import RGBReader, TooLarge, declared_size
from turbotrain.data.vision import ImageBatch, NormalizeCollate

log = logging.getLogger("turbotrain")


class EncodedBatch(NamedTuple):
    """What a worker hands over: the kept files' bytes (one tensor, `sizes` long each: one shared
    memory segment per batch, not one file descriptor per file, which runs out), their labels and
    draws, the count of files dropped, and a seed for the ops that draw as they apply (the main
    process's RNG is not the loader's)."""

    data: torch.Tensor
    sizes: list[int]
    names: list[str]  # what a warning calls each file
    labels: torch.Tensor
    shapes: list[tuple[int, int]]
    draws: list[list]
    dropped: int
    seed: int

    @property
    def files(self) -> list[torch.Tensor]:
        return list(torch.split(self.data, self.sizes))


def check_gpu_decode(cfg) -> None:
    if cfg.decode != "gpu":
        return
    if not torch.cuda.is_available():
        raise ConfigError("data.decode=gpu needs CUDA (nvJPEG) and this machine has none: use data.decode=cpu")
    if cfg.cache != "none":
        raise ConfigError(f"data.decode=gpu decodes the JPEG files themselves: it needs data.cache=none, not {cfg.cache}")


class EncodedTrain(Dataset):
    """The worker half: a batch of a source's files, read and checked, with its draws."""

    def __init__(self, source, pipeline: BatchPipeline, reader: RGBReader):
        self.source, self.pipeline, self.reader = source, pipeline, reader

    def __len__(self) -> int:
        return len(self.source)

    def _read(self, i: int) -> tuple[torch.Tensor, tuple[int, int]] | None:
        try:  # the header is read once: for the size limit and for the draws
            data = self.source.encoded(i)
            shape = declared_size(data)
            why = self.reader.refusal_of(shape[0] * shape[1])
        except TooLarge as e:
            why = self.reader.refusal_of(e.pixels) or f"{type(e).__name__}: {e}"
        except Exception as e:  # unreadable, or no image header: a bad sample, named
            why = f"{type(e).__name__}: {e}"
        if why:
            log.warning("bad sample %s: %s (skipped)", self.source.name(i), why)
            return None
        return data, shape

    def __getitems__(self, indices: list[int]) -> EncodedBatch:
        read = [(i, r) for i in indices if (r := self._read(i)) is not None]
        shapes = [shape for _, (_, shape) in read]
        files = [data for _, (data, _) in read]
        return EncodedBatch(
            data=torch.cat(files) if files else torch.empty(0, dtype=torch.uint8),
            sizes=[len(f) for f in files],
            names=[self.source.name(i) for i, _ in read],
            labels=torch.tensor([int(self.source.labels[i]) for i, _ in read], dtype=torch.int64),
            shapes=shapes,
            draws=self.pipeline.draw(shapes, [i for i, _ in read]),
            dropped=len(indices) - len(read),
            seed=int(torch.randint(2**62, ())),
        )

    def __getitem__(self, i: int) -> EncodedBatch:
        return self.__getitems__([i])


class PassEncoded:
    """The loaders' collate: an EncodedBatch (training) goes to the main process as it is; the
    evaluation loaders' samples take `collate`."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, batch):
        return batch if isinstance(batch, EncodedBatch) else self.collate(batch)


class DeviceDecode:
    """The main-process half: the train loader's batches decoded and augmented on `device`, as
    (images, labels, dropped). Other attributes are the loader's."""

    def __init__(self, loader, pipeline: BatchPipeline, normalize: NormalizeCollate, device: torch.device):
        self.loader, self.pipeline, self.normalize, self.device = loader, pipeline, normalize, device

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[tuple]:
        return map(self.finish, self.loader)

    def finish(self, batch: EncodedBatch) -> tuple:
        files = batch.files
        decoded = self._decode(files)
        kept = [k for k, image in enumerate(decoded) if image is not None and tuple(image.shape[-2:]) == batch.shapes[k]]
        for k in sorted(set(range(len(decoded))) - set(kept)):
            log.warning("bad sample %s: nvJPEG could not decode it to the size its header declares (skipped)", batch.names[k])
        draws = [[d[k] for k in kept] for d in batch.draws]
        with torch.random.fork_rng(devices=[]):  # ops that draw as they apply: from the worker's seed
            torch.default_generator.manual_seed(batch.seed)
            images = self.pipeline.apply([decoded[k] for k in kept], draws)
        labels = batch.labels[kept].to(self.device, non_blocking=True)
        images, labels = self.normalize(ImageBatch(images, labels))
        return images, labels, batch.dropped + len(files) - len(kept)

    def _decode(self, files: list[torch.Tensor]) -> list[torch.Tensor | None]:
        if not files:
            return []
        try:
            return decode_jpeg(files, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            return [self._decode_one(f) for f in files]

    def _decode_one(self, data: torch.Tensor) -> torch.Tensor | None:
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            return None
