#!/usr/bin/env python3
"""Tokenizer throughput: dsaserve's native tokenizer vs HF tokenizers (Python binding, one thread).

Builds a few MB of mixed English / Chinese / code documents deterministically, times HF tokenizers'
encode_batch / decode_batch on them with one thread, runs bench/tokenizer_bench (the C++ side) on the
same documents in the same run, checks both produce the same number of tokens, and prints MB/s for
both and the ratio.

usage: bench/tokenizer_bench.py [--bin build/bench/tokenizer_bench] [--tokenizer DIR] [--mb 4] [--repeat 3]
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time

ENGLISH = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
           "they you were their one all we can her has there been if more when will would who so no model tokens "
           "inference server attention latency throughput memory cache batch request response streaming decode "
           "It's don't we're they've I'd you'll Mr. Smith's 2024 3.5% $1,299 e-mail state-of-the-art").split()
CHINESE = ("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后"
           "多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因"
           "由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问"
           "意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山"
           "统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东")
CODE = [
    "def {f}(self, {a}, {b}=None):\n    if {b} is None:\n        {b} = []\n    for i, x in enumerate({a}):\n"
    "        {b}.append(x * {n})\n    return {b}\n",
    "int {f}(const std::vector<int>& {a}) {{\n  int {b} = 0;\n  for (size_t i = 0; i < {a}.size(); ++i) {b} += {a}[i] * {n};\n"
    "  return {b};\n}}\n",
    "const {f} = async ({a}) => {{\n  const {b} = await fetch(`/api/{a}?limit={n}`);\n  return {b}.json();\n}};\n",
    "SELECT {a}.id, COUNT(*) AS {b} FROM {f} {a} WHERE {a}.value > {n} GROUP BY {a}.id ORDER BY {b} DESC;\n",
]
IDENTS = ["data", "items", "result", "buffer", "tokens", "cfg", "user_id", "parseHeader", "kv_cache", "logits", "mask"]


def build_docs(mb, seed=1234):
    rng = random.Random(seed)
    docs, total = [], 0
    while total < mb * 1_000_000:
        kind = rng.random()
        if kind < 0.45:
            sents = []
            for _ in range(rng.randint(3, 12)):
                words = [rng.choice(ENGLISH) for _ in range(rng.randint(5, 20))]
                sents.append(" ".join(words).capitalize() + rng.choice([".", ".", "!", "?", ";"]))
            doc = " ".join(sents) + "\n"
        elif kind < 0.75:
            doc = "".join(
                "".join(rng.choice(CHINESE) for _ in range(rng.randint(8, 30))) + rng.choice("，。！？；")
                for _ in range(rng.randint(3, 10))) + "\n"
        else:
            doc = "".join(rng.choice(CODE).format(f=rng.choice(IDENTS) + str(rng.randint(0, 99)), a=rng.choice(IDENTS),
                                                  b=rng.choice(IDENTS), n=rng.randint(0, 10000))
                          for _ in range(rng.randint(1, 4)))
        docs.append(doc)
        total += len(doc.encode("utf-8"))
    return docs


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(repo, "build", "bench", "tokenizer_bench"))
    p.add_argument("--tokenizer", default=os.path.join(os.environ.get("DSASERVE_FIXTURES", os.path.join(
        os.path.dirname(repo), "shared", "fixtures")), "tokenizers", "deepseek_v3"))
    p.add_argument("--mb", type=float, default=4.0)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    from tokenizers import Tokenizer
    import tokenizers

    docs = build_docs(args.mb)
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
        docs_path = f.name
    try:
        t0 = time.perf_counter()
        hf = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
        hf_load = time.perf_counter() - t0
        hf_enc = hf_dec = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            encs = hf.encode_batch(docs, add_special_tokens=False)
            hf_enc = min(hf_enc, time.perf_counter() - t0)
            ids = [e.ids for e in encs]
            t0 = time.perf_counter()
            hf.decode_batch(ids, skip_special_tokens=False)
            hf_dec = min(hf_dec, time.perf_counter() - t0)
        hf_tokens = sum(len(i) for i in ids)

        r = subprocess.run([args.bin, "--tokenizer", args.tokenizer, "--docs", docs_path, "--repeat", str(args.repeat)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"tokenizer_bench failed: {r.stderr}")
        ours = json.loads(r.stdout)
    finally:
        os.unlink(docs_path)

    mb = n_bytes / 1e6
    print(f"text: {len(docs)} documents, {mb:.2f} MB (English / Chinese / code), {hf_tokens} tokens; one thread")
    print(f"tokens identical in count: {ours['tokens'] == hf_tokens}; dsaserve round trip exact: {ours['round_trip']}")
    print(f"{'':24}{'encode MB/s':>12}{'decode MB/s':>13}{'load s':>9}")
    print(f"{'HF tokenizers ' + tokenizers.__version__:24}{mb / hf_enc:12.1f}{mb / hf_dec:13.1f}{hf_load:9.3f}")
    print(f"{'dsaserve':24}{ours['encode_mb_s']:12.1f}{ours['decode_mb_s']:13.1f}{ours['load_s']:9.3f}")
    print(f"{'ratio (dsaserve / HF)':24}{ours['encode_mb_s'] / (mb / hf_enc):11.2f}x{ours['decode_mb_s'] / (mb / hf_dec):12.2f}x")
    if ours["tokens"] != hf_tokens:
        sys.exit("token counts differ")


if __name__ == "__main__":
    main()
