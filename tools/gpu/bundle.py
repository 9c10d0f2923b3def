#!/usr/bin/env python3
"""Packs a results tree into a few files small enough for the device tool's return channel
(at most 8 files of 16 MiB, 64 MiB in all, no deep folders), and unpacks them again.

  pack:   python3 bundle.py pack SRC_DIR OUT_DIR      (make_models.py calls pack() itself)
  unpack: python3 bundle.py unpack OUT_DIR DEST_DIR   (on the dev machine, after the run)

The tree becomes one gzip'd tar (hard links stored once: the tokenizer files shared by every
model directory are hard links), split into bundle.tgz.partNN files; small loose files (summary,
log) are copied beside the parts so they can be read without unpacking.
"""
import glob
import os
import shutil
import sys
import tarfile

PART_PREFIX = "bundle.tgz.part"


class BundleTooBig(Exception):
    pass


def pack(src_dir, out_dir, part_bytes=15 * 2**20, max_files=8, max_total=62 * 2**20,
         loose=(), exclude=(), compresslevel=6):
    """Returns {"parts": [...], "bytes": total}. Raises BundleTooBig (leaving out_dir without
    parts) when the result would not fit max_files / max_total."""
    src_dir = os.path.abspath(src_dir)
    if os.path.commonpath([src_dir, os.path.abspath(out_dir)]) == src_dir:
        raise ValueError(f"bundle folder {out_dir} must not be inside {src_dir}")
    os.makedirs(out_dir, exist_ok=True)
    for old in glob.glob(os.path.join(out_dir, PART_PREFIX + "*")):
        os.remove(old)
    tmp_tar = os.path.join(out_dir, ".bundle.tgz.tmp")
    excluded = tuple(os.path.normpath(e) for e in exclude)

    def is_excluded(rel):
        rel = os.path.normpath(rel)
        return any(rel == e or rel.startswith(e + os.sep) for e in excluded)

    def arc(rel):
        return "perry-models" if rel == "." else "perry-models/" + rel.replace(os.sep, "/")

    # Walk by hand (sorted, excluded paths never touched): tarfile records a hard link's first
    # occurrence as the file, so an excluded first occurrence must never be seen at all.
    with tarfile.open(tmp_tar, "w:gz", compresslevel=compresslevel) as tar:
        for root, dirs, files in os.walk(src_dir):
            rel_root = os.path.relpath(root, src_dir)
            dirs[:] = sorted(d for d in dirs if not is_excluded(os.path.join(rel_root, d)))
            tar.add(root, arcname=arc(rel_root), recursive=False)
            for f in sorted(files):
                rel = os.path.normpath(os.path.join(rel_root, f))
                if not is_excluded(rel):
                    tar.add(os.path.join(root, f), arcname=arc(rel), recursive=False)
    size = os.path.getsize(tmp_tar)
    n_parts = max(1, -(-size // part_bytes))
    loose_paths = [os.path.join(src_dir, p) for p in loose if os.path.isfile(os.path.join(src_dir, p))]
    loose_bytes = sum(os.path.getsize(p) for p in loose_paths)
    if n_parts + len(loose_paths) > max_files or size + loose_bytes > max_total:
        os.remove(tmp_tar)
        raise BundleTooBig(f"bundle is {size} bytes in {n_parts} parts (+{len(loose_paths)} loose files, "
                           f"{loose_bytes} bytes); limits {max_files} files, {max_total} bytes")
    parts = []
    with open(tmp_tar, "rb") as f:
        for i in range(n_parts):
            name = f"{PART_PREFIX}{i:02d}"
            with open(os.path.join(out_dir, name), "wb") as g:
                g.write(f.read(part_bytes))
            parts.append(name)
    os.remove(tmp_tar)
    for p in loose_paths:
        shutil.copyfile(p, os.path.join(out_dir, os.path.basename(p)))
    return {"parts": parts, "bytes": size + loose_bytes}


def unpack(parts_dir, dest_dir):
    parts = sorted(glob.glob(os.path.join(parts_dir, PART_PREFIX + "*")))
    if not parts:
        raise FileNotFoundError(f"no {PART_PREFIX}* files in {parts_dir}")
    os.makedirs(dest_dir, exist_ok=True)
    joined = os.path.join(dest_dir, ".bundle.tgz")
    with open(joined, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out)
    with tarfile.open(joined, "r:gz") as tar:
        members = tar.getmembers()
        for m in members:
            # Only plain files, folders and hard links inside the tree.
            if not (m.isfile() or m.isdir() or m.islnk()) or m.name.startswith("/") or ".." in m.name.split("/"):
                raise ValueError(f"refusing bundle member {m.name!r}")
            # The folder comes off the top: dest_dir/models/..., dest_dir/golden/...
            m.name = m.name.split("/", 1)[1] if "/" in m.name else "."
            if m.islnk():
                m.linkname = m.linkname.split("/", 1)[1] if "/" in m.linkname else m.linkname
        try:
            tar.extractall(dest_dir, members=members, filter="data")
        except TypeError:  # Python without extraction filters
            tar.extractall(dest_dir, members=members)
    os.remove(joined)
    return dest_dir


def main(argv):
    if len(argv) == 4 and argv[1] == "pack":
        print(pack(argv[2], argv[3]))
    elif len(argv) == 4 and argv[1] == "unpack":
        print(unpack(argv[2], argv[3]))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
