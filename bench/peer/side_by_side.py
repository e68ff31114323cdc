#!/usr/bin/env python3
"""Joins attention_gpu_bench's tables with flashmla_peer's (same GPU, same run): one row per case both
measured, with dsaserve's time, FlashMLA's, and dsaserve / FlashMLA (below 1: ours is faster).

usage: side_by_side.py OURS.txt PEER.txt   (the two programs' stdout, Markdown tables)

Decode rows are matched on (sparse or dense, KV dtype, heads, batch, query tokens, context); ours is the
shape's default kernel (the first row of a case), FlashMLA's the plain row (its "+metadata" rows and the
two-token case in SGLang's b*q form are listed as their own rows). Prefill rows are matched on (heads,
ctx, T): ours is the attention part of the absorbed form (its "parts" column; the absorb GEMMs are not
FlashMLA's work), FlashMLA's its sparse prefill kernel.
"""
import re
import sys

DECODE = re.compile(
    r"(sparse top-2048|dense) kv=(\w+).*?heads=(\d+) batch=(\d+)(?: q=(\d+))? ctx=(\d+)(.*)$"
)
PEER_PREFILL = re.compile(r"flashmla sparse prefill kv=(\w+) heads=(\d+) ctx=(\d+) T=(\d+)")


def cells(line: str) -> list:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_rows(text: str):
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            yield cells(line)


def decode_key(name: str):
    m = DECODE.search(name)
    if not m:
        return None
    kind, kv, heads, batch, q, ctx, tail = m.groups()
    return (kind, kv, int(heads), int(batch), int(q or 1), int(ctx)), tail


def ours(text: str):
    decode, prefill = {}, {}
    for c in table_rows(text):
        if len(c) >= 2 and (k := decode_key(c[0])):
            try:
                decode.setdefault(k[0], (float(c[1]), c[0]))  # the first row: the default kernel
            except ValueError:
                pass
        elif len(c) >= 6 and c[3] == "absorbed":
            m = re.search(r"attention ([\d.]+)", c[5])
            if m and c[0].isdigit():
                prefill[(int(c[0]), int(c[1]), int(c[2]))] = float(m.group(1))
    return decode, prefill


def peer(text: str):
    decode, prefill = {}, {}
    for c in table_rows(text):
        if len(c) < 2 or not c[0].startswith("flashmla"):
            continue
        try:
            us = float(c[1])
        except ValueError:
            continue
        if m := PEER_PREFILL.search(c[0]):
            prefill[(int(m.group(2)), int(m.group(3)), int(m.group(4)))] = us
        elif k := decode_key(c[0]):
            key, tail = k
            variant = " ".join(v for v, on in (("b*q form", "s_q=1" in c[0]), ("+metadata", "+metadata" in c[0]))
                               if on)
            decode.setdefault((key, variant), us)
    return decode, prefill


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[3], file=sys.stderr)
        return 2
    our_decode, our_prefill = ours(open(sys.argv[1]).read())
    peer_decode, peer_prefill = peer(open(sys.argv[2]).read())
    print("| case | dsaserve us | FlashMLA us | dsaserve / FlashMLA |")
    print("| --- | ---: | ---: | ---: |")
    n = 0
    for (key, variant), p_us in sorted(peer_decode.items()):
        if key not in our_decode:
            continue
        o_us, o_name = our_decode[key]
        kind, kv, heads, batch, q, ctx = key
        kernel = re.search(r"kernel=(\w+)", o_name)
        name = f"{kind} kv={kv} heads={heads} batch={batch}{f' q={q}' if q > 1 else ''} ctx={ctx}"
        if kernel:
            name += f" (ours: {kernel.group(1)})"
        if variant:
            name += f" (FlashMLA {variant})"
        print(f"| {name} | {o_us:.1f} | {p_us:.1f} | {o_us / p_us:.2f} |")
        n += 1
    for key, p_us in sorted(peer_prefill.items()):
        if key in our_prefill:
            heads, ctx, t = key
            o_us = our_prefill[key]
            print(f"| sparse prefill heads={heads} ctx={ctx} T={t} (attention) | {o_us:.1f} | {p_us:.1f} | "
                  f"{o_us / p_us:.2f} |")
            n += 1
    if n == 0:
        print("side_by_side: no case measured by both", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
