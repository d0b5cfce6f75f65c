"""The copy workloads' data: a tree of many files and one large file, made reproducibly."""
import os
import random
from pathlib import Path

from .util import MiB


def pattern_writer():
    base = os.urandom(MiB)

    def write(path: Path, size: int, seed: int):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left, i = size, 0
            while left > 0:
                head = f"{seed:010d} {i:010d}\n".encode()
                chunk = head[:left] + base[len(head):min(left, MiB)]
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
                left -= len(chunk)
                i += 1
        finally:
            os.close(fd)
    return write


def make_data(data: Path, tree_files=5000, tree_bytes=200 * MiB, big_bytes=500 * MiB):
    """tree/: tree_files files, tree_bytes in all (2% of them large, about 1.2 MB at full
    size; the rest 1-32 KiB, in 49 dirs of two levels); big.bin: big_bytes."""
    rnd = random.Random(3)
    write = pattern_writer()
    tree = data / "tree"
    large = max(1, tree_files // 50)
    small_max = min(32 * 1024, max(1024, (tree_bytes // 2) // max(1, tree_files - large) * 2))
    sizes = [rnd.randint(1024, small_max) for _ in range(tree_files - large)]
    rest = max(0, tree_bytes - sum(sizes))
    sizes += [rest // large] * (large - 1) + [rest - (large - 1) * (rest // large)]
    for i, size in enumerate(sizes):
        d = tree / f"d{i % 7}" / f"e{(i // 7) % 7}"
        d.mkdir(parents=True, exist_ok=True)
        write(d / f"f{i:05}", size, i)
    write(data / "big.bin", big_bytes, 999999)
    return tree, data / "big.bin"


def tree_stats(root: Path):
    files = size = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            files += 1
            size += os.lstat(os.path.join(dirpath, n)).st_size
    return files, size
