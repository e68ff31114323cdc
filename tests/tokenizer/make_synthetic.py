#!/usr/bin/env python3
"""Builds small tokenizer.json files that exercise what the DeepSeek-V3 file does not (merges as pairs,
ignore_merges, lstrip / rstrip / single_word / normalized added tokens, normalizers, Split behaviors,
Digits, Punctuation, Metaspace, byte fallback, unknown tokens, other decoders) and records HF
tokenizers' outputs on a set of texts. Run with tokenizers 0.23 from this folder:
  python3 make_synthetic.py   (writes data/*.json and data/synthetic_cases.jsonl)
"""
import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024, isn't it?",
    "def tokenize(text): return [t for t in text.split(' ') if t] # 123 456",
    "naïve café résumé façade — “quotes” and ‘single’ ones… 1,234.56 km",
    "你好，世界！这是一个测试。日本語のテキストです。한국어 텍스트",
    "well-known state-of-the-art e-mail re-entry co-operate 3-4 x-y",
] * 20
TEXTS = [
    "", " ", "The quick brown fox", "  leading and trailing  ", "It's 2024, isn't it?",
    "state-of-the-art 3-4 x--y", "naïve café", "你好，世界！", "한국어 텍스트", "emoji 🙂 here",
    "<special>inside<special>", "a <special> b", "x[lstrip]y", "x   [lstrip]   y", "x[rstrip]   y",
    "a word b", "aword b", "word", "words word.", "NORM and norm and ``quoted``",
    "1234567 12 3", "a,b;;c!!d", "tab\there\nnew line\r\n", "unknown \u0007 bell", "Ωmega ∑",
    "[lstrip][rstrip]<special>", "  <special>  ", "e-mail x-y-z", "ÿþ byte ü",
]


def train(tok, vocab_size, alphabet=None):
    kw = {"initial_alphabet": alphabet} if alphabet is not None else {}
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, **kw)
    tok.train_from_iterator(CORPUS, trainer)


def add_tokens(tok):
    tok.add_special_tokens([AddedToken("<special>", special=True, normalized=False)])
    tok.add_tokens([
        AddedToken("[lstrip]", lstrip=True, normalized=False),
        AddedToken("[rstrip]", rstrip=True, normalized=False),
        AddedToken("word", single_word=True, normalized=False),
        AddedToken("NORM", normalized=True),
    ])


def byte_level_pairs():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.Sequence([normalizers.Replace("``", '"'), normalizers.Strip(left=False, right=True)])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    train(tok, 600, pre_tokenizers.ByteLevel.alphabet())
    add_tokens(tok)
    return tok


def split_behaviors():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_next"),
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Punctuation(behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"[aeiou]"), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    train(tok, 500, pre_tokenizers.ByteLevel.alphabet())
    add_tokens(tok)
    return tok


def metaspace_fallback():
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False, special_tokens=["<unk>"])
    tok.train_from_iterator(CORPUS, trainer)
    # Byte-fallback tokens for every byte, added to the model's vocab.
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault("<0x%02X>" % b, len(vocab))
    tok = Tokenizer.from_str(json.dumps(spec))
    add_tokens(tok)
    return tok


def metaspace_split():
    tok = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False, special_tokens=["<unk>"],
                                  continuing_subword_prefix="##", end_of_word_suffix="</w>")
    tok.train_from_iterator(CORPUS, trainer)
    add_tokens(tok)
    return tok


def misc_splits():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.CharDelimiterSplit("x"),
                                                 pre_tokenizers.BertPreTokenizer(), pre_tokenizers.Whitespace()])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False, special_tokens=["<unk>"])
    tok.train_from_iterator(CORPUS, trainer)
    add_tokens(tok)
    return tok


def byte_normalizer():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.ByteLevel()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("Ġ"), behavior="merged_with_next")
    tok.decoder = decoders.ByteLevel()
    train(tok, 500, pre_tokenizers.ByteLevel.alphabet())
    add_tokens(tok)
    return tok


def main():
    builders = {"byte_level_pairs": byte_level_pairs, "split_behaviors": split_behaviors,
                "metaspace_fallback": metaspace_fallback, "wordpiece_style": metaspace_split,
                "misc_splits": misc_splits, "byte_normalizer": byte_normalizer}
    os.makedirs(os.path.join(HERE, "data"), exist_ok=True)
    with open(os.path.join(HERE, "data", "synthetic_cases.jsonl"), "w") as f:
        for name, build in builders.items():
            tok = build()
            spec = json.loads(tok.to_str())
            if name == "split_behaviors":  # the legacy "a b" merge spelling
                spec["model"]["merges"] = [" ".join(m) for m in spec["model"]["merges"]]
                tok = Tokenizer.from_str(json.dumps(spec))
            with open(os.path.join(HERE, "data", name + ".json"), "w") as out:
                json.dump(spec, out, ensure_ascii=False, indent=None)
            for text in TEXTS:
                for parse_special in (True, False):
                    tok.encode_special_tokens = not parse_special
                    ids = tok.encode(text, add_special_tokens=False).ids
                    f.write(json.dumps({"tokenizer": name, "text": text, "parse_special": parse_special, "ids": ids,
                                        "decoded": tok.decode(ids, skip_special_tokens=False),
                                        "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)},
                                       ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
