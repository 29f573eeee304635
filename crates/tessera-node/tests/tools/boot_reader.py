#!/usr/bin/python3
"""boot_reader: reads the blocks of a file system image's files the way a
booting guest does, one file after the other in a fixed order, each file in
runs of consecutive blocks (readahead), and prints a CRC-32 per file.

    boot_reader.py SOURCE OFFSET RUNS

SOURCE is an nbd:// URI (read with libnbd, Debian's python3-libnbd) or a
local image file; OFFSET is the byte offset of the image inside SOURCE;
RUNS is a text file of lines "FILE FIRST_BLOCK BLOCKS" (4 KiB blocks of the
image, files numbered in reading order, a file's runs in order). With an
nbd:// SOURCE the reader connects, prints "ready" and waits for a line on
standard input before its first read, so several readers start together.

Prints "FILE CRC32" for each file in order, then
"read BYTES bytes in READS reads in SECONDS s". Exits 1 on any failure.
"""

import sys
import time
import zlib

BLOCK = 4096


def load_runs(path):
    runs = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                runs.append(tuple(int(p) for p in parts))
    return runs


def main():
    if len(sys.argv) != 4:
        sys.stderr.write(__doc__)
        return 2
    source, offset, runs = sys.argv[1], int(sys.argv[2]), load_runs(sys.argv[3])
    if source.startswith("nbd://"):
        import nbd

        h = nbd.NBD()
        h.connect_uri(source)
        read = h.pread
        print("ready", flush=True)
        sys.stdin.readline()
    else:
        f = open(source, "rb")

        def read(count, at):
            f.seek(at)
            data = f.read(count)
            if len(data) != count:
                raise IOError(f"short read at {at}: {len(data)} of {count}")
            return data

    crcs = {}
    order = []
    total = 0
    start = time.monotonic()
    for file, first, blocks in runs:
        data = read(blocks * BLOCK, offset + first * BLOCK)
        total += len(data)
        if file not in crcs:
            crcs[file] = 0
            order.append(file)
        crcs[file] = zlib.crc32(data, crcs[file])
    elapsed = time.monotonic() - start
    for file in order:
        print(f"{file} {crcs[file]:08x}")
    print(f"read {total} bytes in {len(runs)} reads in {elapsed:.3f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
