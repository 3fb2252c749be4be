"""Find the few lines of a block that can matter, without looking at the others in Python.

Every rule declares literal trigger words (rules/logs/); a line with none of them can fire no rule and is only
counted. Searching a megabyte for thirty words one after another costs thirty passes, and a regex alternation is
slower still (Python's re tries it at every byte). So each word is given an anchor: its rarest byte in training
logs. `bytes.find` of a single byte is memchr, an order of magnitude faster than a substring search, and an anchor
byte is rare, so a block is swept once per anchor and each hit is checked against the few words that share it.
An anchor that turns out to be common in a block (a 'K' in every 'Ktok/s' line) is dropped for that block in
favour of a plain substring search for its words: the answer never depends on the rarity guess, only the speed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Sequence, Set, Tuple

# Bytes from most to least frequent in training logs (English text, digits, INFO/WARNING/ERROR records, paths,
# 'Ktok/s'); any byte not listed counts as rarer than all of them.
_FREQUENT = (b" 0123456789etaoinsrldcumph.:=/_-,[]()\ngfbINFOywkv'\"ERWA%|DTSCMPGLKxUBHV<>jqzYJQXZ")
_RANK = {byte: rank for rank, byte in enumerate(_FREQUENT)}
_RARE_ENOUGH = _RANK[ord("y")]  # past lowercase letters, digits, punctuation and the letters of INFO
HIT_LIMIT = 64  # anchor hits in one block before its words are searched directly instead


def rarity(byte: int) -> int:
    """Higher is rarer."""
    return _RANK.get(byte, len(_FREQUENT))


@dataclass(frozen=True)
class Anchor:
    byte: bytes  # one byte
    words: Tuple[Tuple[bytes, int], ...]  # (word, offset of the anchor byte in it)


def choose_anchors(words: Iterable[str]) -> Tuple[Anchor, ...]:
    """Few anchors, each rare: a greedy set cover of the words by bytes at least as rare as `_RARE_ENOUGH` (or,
    for a word with no such byte, its rarest one), taking first the byte that covers most words."""
    encoded = sorted({w.encode() for w in words if w})
    candidates = {}
    for word in encoded:
        floor = min(max(rarity(b) for b in word), _RARE_ENOUGH)
        candidates[word] = {b for b in word if rarity(b) >= floor}
    chosen: Dict[int, List[Tuple[bytes, int]]] = {}
    uncovered = set(encoded)
    while uncovered:
        counts: Dict[int, int] = {}
        for word in uncovered:
            for b in candidates[word]:
                counts[b] = counts.get(b, 0) + 1
        byte = max(counts, key=lambda b: (counts[b], rarity(b)))
        for word in sorted(w for w in uncovered if byte in candidates[w]):
            chosen.setdefault(byte, []).append((word, word.index(byte)))
            uncovered.discard(word)
    return tuple(Anchor(bytes([b]), tuple(ws)) for b, ws in sorted(chosen.items()))


class Prefilter:
    """`line_starts(block)`: offsets of the lines of `block` that hold any trigger word, in order."""

    def __init__(self, words: Iterable[str]) -> None:
        self.anchors = choose_anchors(words)

    def line_starts(self, block: bytes, end: int) -> List[int]:
        """Offsets of the lines in block[:end] holding a trigger word, sorted."""
        starts: Set[int] = set()
        for anchor in self.anchors:
            starts.update(_sweep(block, end, anchor))
        return sorted(starts)


def _sweep(block: bytes, end: int, anchor: Anchor) -> Iterable[int]:
    find, rfind = block.find, block.rfind
    words = anchor.words
    hits = 0
    pos = find(anchor.byte, 0, end)
    while pos >= 0:
        for word, offset in words:
            if block.startswith(word, pos - offset, end):
                yield rfind(b"\n", 0, pos) + 1
                break
        hits += 1
        if hits > HIT_LIMIT:
            yield from _search(block, end, words, max(0, pos - max(offset for _, offset in words)))
            return
        pos = find(anchor.byte, pos + 1, end)


def _search(block: bytes, end: int, words: Sequence[Tuple[bytes, int]], start: int) -> Iterable[int]:
    for word, _ in words:
        pos = block.find(word, start, end)
        while pos >= 0:
            yield block.rfind(b"\n", 0, pos) + 1
            line_end = block.find(b"\n", pos, end)
            if line_end < 0:
                break
            pos = block.find(word, line_end, end)
