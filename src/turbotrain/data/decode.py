"""Encoded images (a file's bytes, a tar member's, an Arrow row's) to uint8 CHW tensors with
torchvision.io (libjpeg-turbo), after checking the size the header declares."""

from __future__ import annotations

import io
import re
import warnings

import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.io import ImageReadMode, decode_image, read_file


class TooLarge(ValueError):
    """A header that declares more pixels than PIL opens (twice its default limit)."""

    def __init__(self, pixels: int):
        super().__init__(f"declares {pixels} pixels, beyond PIL's limit")
        self.pixels = pixels


def declared_size(data: str | torch.Tensor) -> tuple[int, int]:
    """(height, width) from the header of a file (a path) or of encoded bytes; nothing is decoded."""
    source = data if isinstance(data, str) else io.BytesIO(data.numpy().tobytes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(source) as im:
                w, h = im.size
        except Image.UnidentifiedImageError as e:  # its message names a BytesIO, not the file
            raise ValueError("no image header PIL knows") from e
        except Image.DecompressionBombError as e:
            raise TooLarge(int(re.search(r"\((\d+) pixels\)", str(e)).group(1))) from e
    return h, w


class RGBReader:
    """Decode straight to a uint8 CHW tensor, after reading the size the image declares: a few
    hundred bytes claiming 60000x60000 pixels would otherwise make the decoder allocate ~10 GB.
    Such an image is a bad sample (skipped and named, or an error). Takes a path or the encoded
    bytes (a uint8 tensor)."""

    def __init__(self, max_pixels: int | None):
        self.max_pixels = max_pixels

    def refusal(self, data: str | torch.Tensor) -> str | None:
        """Why the image is refused before decoding, or None (its header is read only under a limit)."""
        if self.max_pixels is None:
            return None
        try:
            h, w = declared_size(data)
        except TooLarge as e:
            return self.refusal_of(e.pixels)
        return self.refusal_of(h * w)

    def refusal_of(self, pixels: int) -> str | None:
        """Why an image whose header declares `pixels` is refused, or None."""
        if self.max_pixels is not None and pixels > self.max_pixels:
            return f"declares {pixels} pixels, more than data.max_image_pixels={self.max_pixels}"
        return None

    def __call__(self, data: str | torch.Tensor) -> torch.Tensor:
        if isinstance(data, str):
            data = read_file(data)
        if why := self.refusal(data):
            raise ValueError(why)
        return tv_tensors.Image(decode_image(data, mode=ImageReadMode.RGB))
