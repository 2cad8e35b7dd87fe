"""What ptxas made of a kernel, read from its cubin (an ELF64 file): registers per thread, SASS
instructions and local memory per thread (spills and local arrays).

* registers and local bytes: the ``EIATTR_REGCOUNT`` and ``EIATTR_FRAME_SIZE`` attributes of the
  ``.nv.info`` section for the kernel's symbol (what ``cuobjdump --dump-resource-usage`` reports);
* SASS instructions: the ``.text.<kernel>`` section's size over 16 bytes per instruction (sm_70 and
  later).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

INSTRUCTION_BYTES = 16
_REGCOUNT, _FRAME_SIZE = 0x2F, 0x11  # EIATTR_REGCOUNT, EIATTR_FRAME_SIZE: (symbol, value) pairs
_SIZED = 0x04  # EIFMT_SVAL: a 16-bit size, then the payload; every other format is 4 bytes in all


@dataclass(frozen=True)
class KernelStats:
    registers: int
    instructions: int
    local_bytes: int


def _sections(cubin: bytes) -> dict[str, tuple[int, int, int]]:
    """``{name: (offset, size, sh_info)}`` of the cubin's ELF64 sections."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not an ELF64 cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + n * shentsize) for n in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset: int) -> str:
        end = cubin.index(b"\0", names_at + offset)
        return cubin[names_at + offset:end].decode()

    return {name(h[0]): (h[4], h[5], h[7]) for h in headers}


def _attributes(info: bytes):
    """``(attribute, payload)`` of each entry of an ``.nv.info`` section."""
    at = 0
    while at + 4 <= len(info):
        fmt, attribute, size = info[at], info[at + 1], struct.unpack_from("<H", info, at + 2)[0]
        if fmt == _SIZED:
            yield attribute, info[at + 4:at + 4 + size]
            at += 4 + size
        else:
            at += 4


def cubin_stats(cubin: bytes, kernel: str) -> KernelStats:
    """Registers, SASS instructions and local bytes per thread of ``kernel`` in ``cubin``."""
    sections = _sections(cubin)
    text = f".text.{kernel}"
    if text not in sections or ".nv.info" not in sections:
        raise ValueError(f"the cubin has no section {text} or no .nv.info")
    _, size, symbol = sections[text]
    offset, info_size, _ = sections[".nv.info"]
    values = {}
    for attribute, payload in _attributes(cubin[offset:offset + info_size]):
        if attribute in (_REGCOUNT, _FRAME_SIZE) and struct.unpack_from("<I", payload)[0] == symbol:
            values[attribute] = struct.unpack_from("<I", payload, 4)[0]
    if _REGCOUNT not in values:
        raise ValueError(f"the cubin's .nv.info has no register count for {kernel}")
    return KernelStats(values[_REGCOUNT], size // INSTRUCTION_BYTES, values.get(_FRAME_SIZE, 0))

