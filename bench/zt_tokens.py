"""zerotrain's token files and data order in Python, for the PyTorch anchors (bench/pytorch_ddp_gpt.py).

- write_token_file / read_token_file: the ZTTOKENS format of docs/data.md (64-byte header, CRC32C of the
  header and of the tokens, little-endian uint16/uint32 tokens), so that zerotrain (data.format
  "tokens") and PyTorch read the very same file;
- random_tokens: a fixed-seed uniform token stream (benchmark data: step time does not depend on token
  values);
- Sampler: the documented sample order (non-overlapping windows of seq_len + 1 tokens, the splitmix64
  Fisher-Yates epoch permutation, global batch k = stream positions [kB, (k+1)B), rank r of N at
  micro-step a takes k*B + a*m*N + r*m + [0, m)), so a rank reads the samples zerotrain's rank reads.
  Checked against the permutation pinned in docs/data.md (n = 10, seed 0: 0 1 4 6 3 9 8 7 2 5).

Needs numpy (Debian: python3-numpy, a dependency of python3-torch).
"""
import struct

import numpy as np

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def random_tokens(count, vocab, seed=1234):
    return np.random.default_rng(seed).integers(0, vocab, size=count, dtype=np.int64)


def write_token_file(path, tokens, vocab):
    width = 2 if vocab <= 65536 else 4
    body = np.asarray(tokens, dtype="<u2" if width == 2 else "<u4").tobytes()
    head = b"ZTTOKENS" + struct.pack("<IIIIQI", 1, 64, width, vocab, len(tokens), crc32c(body))
    head += struct.pack("<I", crc32c(head)) + bytes(24)
    assert len(head) == 64
    with open(path, "wb") as out:
        out.write(head)
        out.write(body)


def read_token_file(path):
    """(tokens as int64 numpy array, vocab). Checks magic and sizes, not the CRCs (zerotrain neither)."""
    with open(path, "rb") as f:
        head = f.read(64)
        magic, version, header_size, width, vocab, count = struct.unpack("<8sIIIIQ", head[:32])
        if magic != b"ZTTOKENS" or width not in (2, 4):
            raise ValueError(f"{path}: not a ZTTOKENS token file")
        f.seek(header_size)
        tokens = np.frombuffer(f.read(count * width), dtype="<u2" if width == 2 else "<u4")
    if len(tokens) != count:
        raise ValueError(f"{path}: truncated")
    return tokens.astype(np.int64), vocab


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def epoch_order(num_samples, seed, epoch):
    state = seed ^ _mix64((epoch + GOLDEN) & MASK)
    order = list(range(num_samples))
    for i in range(num_samples - 1, 0, -1):
        bound = i + 1
        threshold = (-bound) % bound  # (2^64 - bound) mod bound
        while True:
            state = (state + GOLDEN) & MASK
            x = _mix64(state)
            if x >= threshold:
                break
        j = x % bound
        order[i], order[j] = order[j], order[i]
    return order


assert epoch_order(10, 0, 0) == [0, 1, 4, 6, 3, 9, 8, 7, 2, 5]


class Sampler:
    """Batches of rank `rank` of `ranks`: inputs/targets int64 [micro, seq_len] for global batch k."""

    def __init__(self, tokens, seq_len, seed, micro, ranks, rank, grad_accum=1):
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.micro, self.ranks, self.rank, self.grad_accum = micro, ranks, rank, grad_accum
        self.num_samples = (len(tokens) - 1) // seq_len
        self._orders = {}

    def _sample_at(self, position):
        epoch, offset = divmod(position, self.num_samples)
        if epoch not in self._orders:
            self._orders[epoch] = epoch_order(self.num_samples, self.seed, epoch)
        return self._orders[epoch][offset]

    def sample_ids(self, k, a=0):
        m, n = self.micro, self.ranks
        start = k * m * self.grad_accum * n + a * m * n + self.rank * m
        return [self._sample_at(p) for p in range(start, start + m)]

    def batch(self, k, a=0):
        rows = [self.tokens[i * self.seq_len: i * self.seq_len + self.seq_len + 1] for i in self.sample_ids(k, a)]
        window = np.stack(rows)
        return window[:, :-1], window[:, 1:]
