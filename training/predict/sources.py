"""Where the images come from: a folder tree, an MNIST IDX file, a tar of images or a Parquet file, read as a stream.

Every source yields `Item`s in a fixed order, so that item i is the same image on every run (shards and resume rely
on it). An item carries either encoded bytes (PNG, JPEG, …: decoded as the service decodes an upload) or raw pixels
(IDX, a Parquet column of numbers: read as the service reads a JSON `array`).
"""

from __future__ import annotations

import gzip
import itertools
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, cast

import numpy as np

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
PARQUET_SUFFIXES = (".parquet", ".pq")
IDX_IMAGES_MAGIC = 0x803
IDX_LABELS_MAGIC = 0x801
PARQUET_BATCH_ROWS = 1024


class SourceError(ValueError):
    """An input that cannot be read as any source (missing, empty, unknown format, bad IDX header, no column)."""


@dataclass(frozen=True)
class Item:
    """One image: `source` names it uniquely within the input; exactly one of `data` and `pixels` is set."""

    source: str
    label: str | None
    data: bytes | None = None  # an encoded image file
    pixels: Any = None  # raw pixel values (an array or nested lists), as the service's JSON `array` input


class Source(Protocol):
    kind: str

    def count(self) -> int | None:
        """How many items the source holds, or None when only reading it all would tell (a compressed tar)."""
        ...

    def items(self, start: int = 0) -> Iterator[Item]:
        """The items from position `start` on, in the source's fixed order."""
        ...


def is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_SUFFIXES)


def open_source(
    path: Path, labels: Path | None = None, image_column: str = "image", label_column: str | None = "label"
) -> Source:
    """The source for `path`: a directory, a tar, a Parquet file, or else an IDX image file (gzip or not)."""
    if not path.exists():
        raise SourceError(f"input {path} does not exist")
    if path.is_dir():
        return FolderSource(path)
    name = path.name.lower()
    if name.endswith(PARQUET_SUFFIXES):
        return ParquetSource(path, image_column, label_column)
    if name.endswith(TAR_SUFFIXES):
        return TarSource(path)
    return IdxSource(path, labels if labels is not None else sibling_labels(path))


class FolderSource:
    """Image files under a directory, sorted by path; the label is the first sub-folder's name (none at the top)."""

    kind = "folder"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if is_image_name(p.name))
        if not self.files:
            raise SourceError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) under {root}")

    def count(self) -> int:
        return len(self.files)

    def items(self, start: int = 0) -> Iterator[Item]:
        for relative in self.files[start:]:
            yield Item(relative, folder_label(relative), data=(self.root / relative).read_bytes())


def folder_label(relative: str) -> str | None:
    """The first folder of a relative path ("7/a.png" -> "7"), None for a file at the top."""
    head, sep, _ = relative.partition("/")
    return head if sep else None


class TarSource:
    """Image members of a tar (any compression), in archive order; labels as for a folder tree."""

    kind = "tar"

    def __init__(self, path: Path) -> None:
        self.path = path
        if not tarfile.is_tarfile(path):
            raise SourceError(f"{path} is not a tar archive")

    def count(self) -> int | None:
        if self.path.name.lower().endswith(".tar"):  # uncompressed: the headers are read by seeking, cheaply
            with tarfile.open(self.path, "r:") as archive:
                return sum(1 for m in archive if m.isfile() and is_image_name(m.name))
        return None

    def items(self, start: int = 0) -> Iterator[Item]:
        with tarfile.open(self.path, "r|*") as archive:  # a stream: members are read once, in order
            members = (m for m in archive if m.isfile() and is_image_name(m.name))
            for member in itertools.islice(members, start, None):
                f = archive.extractfile(member)
                data = f.read() if f is not None else b""
                name = member.name.removeprefix("./")
                yield Item(f"{self.path.name}:{name}", folder_label(name), data=data)


def open_maybe_gzip(path: Path) -> IO[bytes]:
    with path.open("rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return cast(IO[bytes], gzip.open(path, "rb")) if gzipped else path.open("rb")


def sibling_labels(images: Path) -> Path | None:
    """MNIST's label file beside an image file (t10k-images-idx3-ubyte[.gz] -> t10k-labels-idx1-ubyte[.gz])."""
    if "images-idx3" not in images.name:
        return None
    labels = images.with_name(images.name.replace("images-idx3", "labels-idx1"))
    return labels if labels.is_file() else None


def read_idx_header(f: IO[bytes], path: Path, magic: int) -> tuple[int, ...]:
    """The dimensions of an IDX file of unsigned bytes (magic 0x803 images, 0x801 labels)."""
    head = f.read(4)
    if len(head) < 4 or int.from_bytes(head, "big") != magic:
        found = f"0x{int.from_bytes(head, 'big'):x}" if len(head) == 4 else f"{len(head)} bytes"
        raise SourceError(
            f"{path} is not an IDX file of {'images' if magic == IDX_IMAGES_MAGIC else 'labels'} "
            f"(magic 0x{magic:x} expected, found {found})"
        )
    ndim = magic & 0xFF
    raw = f.read(4 * ndim)
    if len(raw) < 4 * ndim:
        raise SourceError(f"{path}: truncated IDX header")
    return tuple(int.from_bytes(raw[4 * i : 4 * i + 4], "big") for i in range(ndim))


class IdxSource:
    """An IDX image file (uint8, N × H × W), read a block at a time; labels from the matching IDX label file."""

    kind = "idx"
    BLOCK = 4096  # images per read

    def __init__(self, path: Path, labels: Path | None) -> None:
        self.path, self.labels = path, labels
        with open_maybe_gzip(path) as f:
            self.shape = read_idx_header(f, path, IDX_IMAGES_MAGIC)
        if len(self.shape) != 3:
            raise SourceError(f"{path}: IDX images must be N × H × W, found dimensions {list(self.shape)}")
        if labels is not None:
            with open_maybe_gzip(labels) as f:
                (n,) = read_idx_header(f, labels, IDX_LABELS_MAGIC)
            if n != self.shape[0]:
                raise SourceError(f"{labels} holds {n} labels for the {self.shape[0]} images of {path}")

    def count(self) -> int:
        return self.shape[0]

    def items(self, start: int = 0) -> Iterator[Item]:
        n, height, width = self.shape
        size = height * width
        with open_maybe_gzip(self.path) as images, self._labels() as labels:
            read_idx_header(images, self.path, IDX_IMAGES_MAGIC)
            skip(images, start * size)
            if labels is not None:
                skip(labels, start)
            for first in range(start, n, self.BLOCK):
                count = min(self.BLOCK, n - first)
                raw = images.read(count * size)
                if len(raw) < count * size:
                    raise SourceError(f"{self.path} is truncated: image {first + len(raw) // size} is incomplete")
                block = np.frombuffer(raw, np.uint8).reshape(count, height, width)
                names = labels.read(count) if labels is not None else None
                for i in range(count):
                    label = str(names[i]) if names is not None and i < len(names) else None
                    yield Item(f"{self.path.name}#{first + i}", label, pixels=block[i])

    def _labels(self) -> IO[bytes] | _Nothing:
        if self.labels is None:
            return _Nothing()
        f = open_maybe_gzip(self.labels)
        read_idx_header(f, self.labels, IDX_LABELS_MAGIC)
        return f


class _Nothing:
    """A context manager that stands for an absent file."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def skip(f: IO[bytes], n: int) -> None:
    while n > 0:
        chunk = f.read(min(n, 1 << 20))
        if not chunk:
            return
        n -= len(chunk)


class ParquetSource:
    """A Parquet file with an image column: encoded bytes, a {bytes, path} struct (Hugging Face's image feature) or
    numbers (flat or nested) that are raw pixels; an optional label column. Read one row batch at a time."""

    kind = "parquet"

    def __init__(self, path: Path, image_column: str, label_column: str | None) -> None:
        import pyarrow.parquet as pq

        self.path = path
        try:
            self.file = pq.ParquetFile(path)
        except Exception as e:  # pyarrow raises its own ArrowInvalid for a file that is not Parquet
            raise SourceError(f"{path} cannot be read as Parquet: {e}") from e
        names = self.file.schema_arrow.names
        if image_column not in names:
            raise SourceError(f"{path} has no column {image_column!r} (columns: {names}); name it with --image-column")
        self.image_column = image_column
        self.label_column = label_column if label_column in names else None

    def count(self) -> int:
        return self.file.metadata.num_rows

    def items(self, start: int = 0) -> Iterator[Item]:
        columns = [self.image_column] + ([self.label_column] if self.label_column else [])
        position = 0
        for batch in self.file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
            if position + batch.num_rows <= start:
                position += batch.num_rows
                continue
            images = batch.column(self.image_column).to_pylist()
            labels = batch.column(self.label_column).to_pylist() if self.label_column else [None] * len(images)
            for i in range(max(0, start - position), batch.num_rows):
                yield parquet_item(f"{self.path.name}#{position + i}", images[i], labels[i])
            position += batch.num_rows


def parquet_item(source: str, value: Any, label: Any) -> Item:
    """An item from one Parquet cell: bytes are an encoded image, a struct gives its bytes (and path), numbers are
    pixels."""
    text = None if label is None else str(label)
    if isinstance(value, dict):
        source = value.get("path") or source
        value = value.get("bytes")
    if isinstance(value, bytes | bytearray | memoryview):
        return Item(source, text, data=bytes(value))
    if value is None:
        return Item(source, text, data=b"")  # the service's "image is empty" error
    return Item(source, text, pixels=value)
