#!/usr/bin/env python3
"""Property test: `dsaserve tokenize` / `detokenize` against HF tokenizers on generated strings.

Generates >= 10,000 strings (seeded): mixed scripts, emoji and ZWJ sequences, digit runs, whitespace
runs, special-token text, invalid-looking sequences and random code points. Encodes them with HF
tokenizers (pip) and with ONE `dsaserve tokenize` process (all strings over stdin) and requires
identical ids, with special-token parsing on and off. Then decodes HF's ids and random id sequences
(many splitting multi-byte characters) with ONE `dsaserve detokenize --stream` process and requires
the text to equal HF's decode and the streamed chunks to concatenate to it.

usage: property_test.py --dsaserve PATH [--fixtures DIR] [--count N] [--seed S]
Exit 77 (skipped) only when the fixtures are missing; any mismatch fails.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

SKIP = 77


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.environ.get("DSASERVE_REPO", os.path.dirname(os.path.dirname(here)))
    default_fixtures = os.environ.get("DSASERVE_FIXTURES", os.path.join(os.path.dirname(repo), "shared", "fixtures"))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsaserve", required=True, help="the built dsaserve binary")
    p.add_argument("--fixtures", default=default_fixtures)
    p.add_argument("--count", type=int, default=10000)
    p.add_argument("--seed", type=int, default=20240607)
    return p.parse_args()


# ---- string generation -------------------------------------------------------------------------

WORDS = ("the quick brown fox jumps over lazy dog hello world It's isn't we're you've I'm they'll she'd "
         "Tokenization BPE naïve café résumé coöperate façade Straße déjà-vu e-mail state-of-the-art "
         "don't CAN'T O'Neil x86_64 __init__ camelCase snake_case HTTPServer URL https://example.com/a?b=1&c=2 "
         "user@mail.org #hashtag @mention $HOME ~/.bashrc C:\\Windows\\ 1st 2nd 3rd 4th 10x").split()
CODE = ["def f(x):\n    return x**2\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }", "if x != y && !z || w:",
        "console.log(`${a}+${b}`);", "#include <vector>\n", "SELECT * FROM t WHERE id = 42;", "x = {'a': [1, 2, 3]}",
        "fn main() -> Result<(), Box<dyn Error>> {}", "    \t\tindented\n\n", "<div class=\"x\">&amp;</div>",
        "$ echo \"hi\" | grep -E '^h' > /dev/null 2>&1", "λx. x + 1", "a:=b;c::d->e", "/* comment */ // line"]
SCRIPTS = [
    "你好世界这是一个测试中文分词的句子", "鿦鿧鿨龦龧鿿", "㐀㐁㐂䶵", "𠀀𠀁𠀂𪛖𫝀", "日本語のテキストです。カタカナ、ひらがな",
    "ｶﾀｶﾅ ﾊﾝｶｸ", "ー・「」『』【】〜", "한국어 텍스트 처리 ㄱㄴㄷ 각", "Ελληνικά κείμενα ΆΈΉ", "Русский текст Ёё",
    "العربية مَرْحَبًا بِكُمْ", "עברית שָׁלוֹם", "हिन्दी पाठ क्षत्रिय", "ภาษาไทย สวัสดีครับ", "ქართული", "Հայերեն",
    "Tiếng Việt có dấu", "ʻŌlelo Hawaiʻi", "ñandú ü ß ẞ Ǆǅǆ ﬁﬂ", "Ａｂｃ１２３！？", "∑∫∂√∞≈≠≤≥ ±×÷", "€£¥₹₿¢",
    "ᚠᚢᚦᚨᚱᚲ", "ⴰⵣⵓⵍ", "ᠮᠣᠩᠭᠣᠯ", "𐌰𐌱𐌲", "ꦧꦱꦗꦮ", "ߒߞߏ", "ᓀᐦᐃᔭᐍᐏᐣ",
]
EMOJI = ["🙂", "😀😃😄", "👍🏽", "👋🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🧑‍🤝‍🧑", "🏳️‍🌈", "🏴‍☠️", "❤️‍🔥", "🇺🇸🇯🇵🇩🇪", "🇦",
         "1️⃣", "#️⃣", "©️", "™", "🏴󠁧󠁢󠁥󠁮󠁧󠁿", "☺︎", "🫠🫡", "🪿🩷", "‍", "️", "🤷‍♀️"]
DIGITS = ["0", "7", "42", "123", "1234", "12345", "1234567890", "3.14159", "1,000,000", "2024-06-07", "0x1F",
          "1e-9", "٠١٢٣٤٥٦", "०१२३", "１２３４", "²³¹", "½¾⅓", "ⅠⅡⅫ", "①②③", "𝟏𝟐𝟑", "๑๒๓", "+86 138 0013 8000"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "\u2009", "\u200b", "\u2028", "\u2029",
          "\u0085", "\u000b", "\u000c", "\u180e", "\u202f", "\u205f", "\ufeff"]
INVALID_LOOKING = ["\ufffd", "\\xff\\xfe", "Ã©Ã¨", "ï»¿", "\u0000", "\u0001\u001f", "\u007f", "\u0080\u009f",
                   "\ufdd0", "\uffff", "\U0010ffff", "\ue000", "\U000f0000", "\\ud800", "\u0301\u0308",
                   "<0xFF>", "<0x0A>", "\u0378", "\U000e0080", "\U000105c0", "\U000323b0", "\U00031350",
                   "%E4%BD%A0", "&#x1F600;", "\\u00e9", "\u202e\u202d", "\u2066\u2069", "\u00ad", "ÿþ"]


def special_texts(added):
    partial = ["<｜User", "<｜", "｜>", "<|EOT|", "<｜begin▁of", "▁", "<｜▁pad▁", "<<｜User｜>>", "｜User｜",
               "<｜place▁holder▁no▁", "<｜tool▁sep｜", "<think>", "</think>"]
    return added, partial


def make_strings(rng, n, added):
    full, partial = special_texts(added)
    common_special = [t for t in full if "place" not in t]

    def fragment():
        k = rng.random()
        if k < 0.20:
            return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
        if k < 0.30:
            return rng.choice(CODE)
        if k < 0.45:
            s = rng.choice(SCRIPTS)
            a = rng.randrange(len(s))
            return s[a:a + rng.randint(1, 12)]
        if k < 0.55:
            return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
        if k < 0.64:
            return rng.choice(DIGITS) if rng.random() < 0.6 else "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 14)))
        if k < 0.74:
            return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 8)))
        if k < 0.84:
            r = rng.random()
            if r < 0.5:
                return rng.choice(common_special)
            if r < 0.7:
                return rng.choice(full)
            return rng.choice(partial)
        if k < 0.92:
            return rng.choice(INVALID_LOOKING)
        # random code points from the whole range (no surrogates)
        out = []
        for _ in range(rng.randint(1, 5)):
            c = rng.randrange(0x110000) if rng.random() < 0.5 else rng.randrange(0x3000)
            if 0xD800 <= c < 0xE000:
                c = 0x20
            out.append(chr(c))
        return "".join(out)

    strings = []
    for i in range(n):
        if i % 97 == 0:
            parts = [fragment() for _ in range(rng.randint(40, 200))]  # a few long texts
        else:
            parts = [fragment() for _ in range(rng.randint(1, 10))]
        sep = rng.choice(["", "", " ", "\n"])
        strings.append(sep.join(parts))
    return strings


# ---- running dsaserve --------------------------------------------------------------------------

def run(binary, args, lines):
    inp = "".join(json.dumps(l, ensure_ascii=False) + "\n" for l in lines).encode("utf-8")
    r = subprocess.run([binary] + args, input=inp, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: dsaserve {' '.join(args)} exited {r.returncode}: {r.stderr.decode(errors='replace')[-2000:]}")
    # Lines end at "\n" only: decoded text may hold U+2028 or U+0085, which str.splitlines() splits on.
    out = [json.loads(l) for l in r.stdout.decode("utf-8").split("\n") if l]
    if len(out) != len(lines):
        sys.exit(f"FAIL: dsaserve {args[0]} wrote {len(out)} lines for {len(lines)} inputs")
    return out


def main():
    args = parse_args()
    tok_dir = os.path.join(args.fixtures, "tokenizers", "deepseek_v3")
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        print(f"SKIPPED: fixture {tok_dir}/tokenizer.json missing: set DSASERVE_FIXTURES to the shared fixtures "
              "folder (../shared/fixtures beside the repository)")
        return SKIP
    if not os.access(args.dsaserve, os.X_OK):
        sys.exit(f"FAIL: dsaserve binary {args.dsaserve} not found or not executable")
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        sys.exit(f"FAIL: HF tokenizers is needed (pip install -r scripts/requirements.txt): {e}")

    t0 = time.time()
    hf = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    added = [t.content for t in hf.get_added_tokens_decoder().values()]
    rng = random.Random(args.seed)
    strings = make_strings(rng, args.count, sorted(added))
    no_special = [s for i, s in enumerate(strings) if i % 5 == 0]  # also encoded with special-token parsing off

    # Encode: HF (batch) vs one dsaserve process.
    hf.encode_special_tokens = False
    expected = [e.ids for e in hf.encode_batch(strings, add_special_tokens=False)]
    hf.encode_special_tokens = True
    expected += [e.ids for e in hf.encode_batch(no_special, add_special_tokens=False)]
    hf.encode_special_tokens = False
    lines = [{"text": s} for s in strings] + [{"text": s, "parse_special": False} for s in no_special]
    got = [o["ids"] for o in run(args.dsaserve, ["tokenize", "--tokenizer", tok_dir], lines)]
    mismatches = [i for i in range(len(lines)) if got[i] != expected[i]]
    for i in mismatches[:10]:
        print(f"MISMATCH text={lines[i]['text']!r} parse_special={lines[i].get('parse_special', True)}\n"
              f"  hf:   {expected[i][:40]}\n  ours: {got[i][:40]}")

    # Decode / stream: HF's ids of every string, plus random id sequences that split characters.
    vocab_size = hf.get_vocab_size(with_added_tokens=True)
    byte_ids = [hf.token_to_id(c) for c in pre_byte_alphabet()]
    id_lists = [ids for ids in expected]
    for _ in range(3000):
        n = rng.randint(1, 30)
        id_lists.append([rng.randrange(vocab_size) if rng.random() < 0.4 else rng.choice(byte_ids) for _ in range(n)])
    skips = [i % 2 == 1 for i in range(len(id_lists))]
    dec_lines = [{"ids": ids, "skip_special_tokens": skip} for ids, skip in zip(id_lists, skips)]
    decoded = run(args.dsaserve, ["detokenize", "--tokenizer", tok_dir, "--stream"], dec_lines)
    dec_bad = stream_bad = 0
    for ids, skip, out in zip(id_lists, skips, decoded):
        want = hf.decode(ids, skip_special_tokens=skip)
        if out["text"] != want:
            dec_bad += 1
            if dec_bad <= 10:
                print(f"DECODE MISMATCH ids={ids[:30]} skip={skip}\n  hf:   {want!r}\n  ours: {out['text']!r}")
        if "".join(out["chunks"]) != out["text"]:
            stream_bad += 1
            if stream_bad <= 10:
                print(f"STREAM MISMATCH ids={ids[:30]} skip={skip}\n  chunks: {out['chunks']!r}\n  text: {out['text']!r}")

    n_chars = sum(len(s) for s in strings)
    print(f"{len(lines)} encodings ({len(strings)} strings, {n_chars} characters; {len(no_special)} also without "
          f"special-token parsing): {len(mismatches)} id mismatches")
    print(f"{len(dec_lines)} decodings: {dec_bad} text mismatches, {stream_bad} streaming mismatches "
          f"({time.time() - t0:.1f} s)")
    ok = not mismatches and not dec_bad and not stream_bad and len(strings) >= 10000
    print(f"{1 if ok else 0} passed, {0 if ok else 1} failed")
    return 0 if ok else 1


def pre_byte_alphabet():
    """The 256 characters of the byte-level alphabet (GPT-2's bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


if __name__ == "__main__":
    sys.exit(main())
