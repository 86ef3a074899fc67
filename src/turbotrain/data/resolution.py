"""Training resolution per batch: fixed, dynamic (random scale per batch) or progressive (small
first, full size by a fraction of training, Composer-style). Applied on the device after loading,
so the input pipeline decodes and augments at one size; evaluation always runs at the nominal size.
The size of step k depends only on (seed, k), so resumed runs see the same sizes."""

from __future__ import annotations

import random

import torch
from torch.nn import functional as F

from turbotrain.config import ConfigError


class Resolution:
    def __init__(self, data_cfg, nominal: int, total_steps: int, seed: int):
        self.mode, self.nominal, self.total, self.seed = data_cfg.resolution, nominal, max(1, total_steps), seed
        self.lo, self.hi = data_cfg.resolution_scale
        self.step = data_cfg.resolution_step
        self.start, self.until = data_cfg.progressive_start, data_cfg.progressive_until
        if not 0 < self.lo <= self.hi:
            raise ConfigError(f"data.resolution_scale={list(data_cfg.resolution_scale)} must be 0 < low <= high")

    def size(self, step: int) -> int:
        if self.mode == "dynamic":
            scale = random.Random(self.seed * 1_000_003 + step).uniform(self.lo, self.hi)
        elif self.mode == "progressive":
            scale = self.start + (1 - self.start) * min(1.0, step / (self.until * self.total))
        else:
            return self.nominal
        return max(self.step, int(round(self.nominal * scale / self.step)) * self.step)

    def __call__(self, images: torch.Tensor, step: int) -> torch.Tensor:
        size = self.size(step)
        if size == images.shape[-1] or images.ndim != 4:
            return images
        out = F.interpolate(images, size=(size, size), mode="bilinear", antialias=size < images.shape[-1], align_corners=False)
        return (
            out.contiguous(memory_format=torch.channels_last) if images.is_contiguous(memory_format=torch.channels_last) else out
        )
