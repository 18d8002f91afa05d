"""The tokenizer and the data set torchtitan's trainer reads, made locally from a text file: nothing is
downloaded at run time.

    python examples/frameworks/torchtitan/prepare.py /work/shared/data/tinyshakespeare.txt examples/frameworks/torchtitan

Writes, under the output folder (default: this example's folder):
- ``assets/tokenizer/tokenizer.json``: a byte-level BPE tokenizer in the Hugging Face ``tokenizers``
  format (what torchtitan's HuggingFaceTokenizer loads with ``Tokenizer.from_file``): the 256 byte
  symbols, then the most frequent adjacent pairs of the text merged, up to ``--vocab`` entries
  (at most 2048, the llama3 debug model's), then ``<|begin_of_text|>`` and ``<|end_of_text|>``, then,
  for a ``--vocab`` above 2048 (``--vocab 128256``: the real Llama 3 vocabulary's size, for a
  full-size plan), ``<|reserved_special_token_N|>`` entries up to ``--vocab``;
  ``tokenizer_config.json`` names those two as bos and eos;
- with ``--tiktoken``, ``assets/tokenizer/tokenizer.model`` too: the same byte-level tokens in
  tiktoken's BPE file format (a base64 token and its rank a line), what torchtitan of December 2024
  (commit 9dec370, the trainer of its published H100 benchmarks) loads with ``load_tiktoken_bpe``;
  it adds 256 special tokens of its own, so the file holds ``--vocab`` - 256 ranks (distinct filler
  byte strings after the learnt ones: 128,000 for ``--vocab 128256``);
- ``data/shakespeare/train.jsonl``: the text in records of ``--chars`` characters, ``{"text": ...}``
  a line, which torchtitan's ``c4_test`` loader reads from a local folder
  (``--training.dataset c4_test --training.dataset-path data/shakespeare``).

Pure Python and deterministic (the same text gives the same files); a few seconds for 1 MB of text.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re

SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>")
# GPT-2's split of text into words before BPE (the ByteLevel pre-tokenizer's regex, ASCII letters here)
SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def byte_symbols() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character (the ByteLevel pre-tokenizer's alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def train_bpe(text: str, vocab: int) -> tuple[list[str], list[tuple[str, str]]]:
    """The vocabulary (byte symbols first, then each merge's result) and the merges, most frequent pair
    first (ties: the smaller pair), over the words of text."""
    sym = byte_symbols()
    words = collections.Counter("".join(sym[b] for b in w.encode("utf-8")) for w in SPLIT.findall(text))
    seqs = {w: list(w) for w in words}
    tokens = [sym[b] for b in range(256)]
    merges = []
    while len(tokens) + len(SPECIAL) < vocab:
        pairs = collections.Counter()
        for w, n in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append((a, b))
        tokens.append(a + b)
        for w, s in seqs.items():
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return tokens, merges


def tokenizer_json(tokens: list[str], merges: list[tuple[str, str]], vocab: int = 0) -> dict:
    """The ``tokenizers`` library's JSON of a byte-level BPE model with two special tokens, then
    reserved special tokens up to ``vocab`` entries in all (none when vocab is at most the others)."""
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    specials = [*SPECIAL, *(f"<|reserved_special_token_{i}|>" for i in range(vocab - len(tokens) - len(SPECIAL)))]
    added = [{"id": len(tokens) + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(specials)]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": level, "post_processor": level, "decoder": level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [[a, b] for a, b in merges]}}


def tiktoken_lines(tokens: list[str], vocab: int) -> list[str]:
    """tiktoken's BPE file of ``vocab - 256`` ranks (at least the 256 bytes): the learnt tokens as bytes,
    then fillers (a zero byte and the rank, 4 bytes: never a merge of text), one ``base64 rank`` a line."""
    import base64

    to_byte = {c: b for b, c in byte_symbols().items()}
    ranks = [bytes(to_byte[c] for c in t) for t in tokens][:max(256, vocab - 256)]
    ranks += [b"\0" + r.to_bytes(3, "big") for r in range(len(ranks), vocab - 256)]
    return [f"{base64.b64encode(t).decode()} {r}" for r, t in enumerate(ranks)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("corpus", help="a UTF-8 text file, e.g. /work/shared/data/tinyshakespeare.txt")
    p.add_argument("out", nargs="?", default=os.path.dirname(os.path.abspath(__file__)), help="the output folder")
    p.add_argument("--vocab", type=int, default=512, help="tokenizer entries, specials included (258..2048 learnt; above: reserved tokens pad "
                   "up to it, e.g. 128256, Llama 3's)")
    p.add_argument("--train-chars", type=int, default=200_000, help="characters of the text the merges are learnt on")
    p.add_argument("--chars", type=int, default=2000, help="characters a data record")
    p.add_argument("--tiktoken", action="store_true", help="also tokenizer.model in tiktoken's format (torchtitan "
                   "of December 2024)")
    a = p.parse_args()
    if not 258 <= a.vocab <= 1 << 20:
        p.error(f"--vocab {a.vocab}: 258..1048576 (256 bytes + 2 specials at least; the debug model's embedding has "
                f"2048, Llama 3's 128256), e.g. --vocab 512")
    with open(a.corpus, encoding="utf-8") as fh:
        text = fh.read()
    tokens, merges = train_bpe(text[:a.train_chars], min(a.vocab, 2048))
    tok = os.path.join(a.out, "assets", "tokenizer")
    data = os.path.join(a.out, "data", "shakespeare")
    os.makedirs(tok, exist_ok=True)
    os.makedirs(data, exist_ok=True)
    with open(os.path.join(tok, "tokenizer.json"), "w", encoding="utf-8") as fh:
        json.dump(tokenizer_json(tokens, merges, a.vocab), fh, ensure_ascii=False)
    with open(os.path.join(tok, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump({"bos_token": SPECIAL[0], "eos_token": SPECIAL[1], "add_bos_token": True, "add_eos_token": True}, fh)
    if a.tiktoken:
        with open(os.path.join(tok, "tokenizer.model"), "w", encoding="ascii") as fh:
            fh.write("\n".join(tiktoken_lines(tokens, a.vocab)) + "\n")
    with open(os.path.join(data, "train.jsonl"), "w", encoding="utf-8") as fh:
        for i in range(0, len(text), a.chars):
            fh.write(json.dumps({"text": text[i:i + a.chars]}) + "\n")
    print(f"tokenizer: {max(a.vocab, len(tokens) + len(SPECIAL))} entries ({len(merges)} merges) in {tok}; "
          f"data: {-(-len(text) // a.chars)} records in {data}")


if __name__ == "__main__":
    main()
