"""A BERT encoder (post-LN, exact-erf GELU, as Hugging Face's BertModel) and its WordPiece
tokenizer in NumPy, for measuring what pruning does to a real checkpoint (all-MiniLM-L6-v2 and
other BERT-family safetensors) and for collecting calibration statistics. No PyTorch needed.

    from tilejit import bert
    model = bert.Bert.from_dir("default-model/all-MiniLM-L6-v2")
    tok = bert.WordPiece(model.dir + "/vocab.txt")
    emb = model.embed_batch([tok.encode(s) for s in sentences])   # [B × hidden], L2-normalised

Sentences are processed as one token stream: every linear layer sees all tokens of all
sentences at once ([tokens × features]), attention runs per sentence, so nothing is padded.
`linear(name, x)` can be replaced (e.g. by tilejit's own kernels, or a hook that records x).

The encoder is split into the stages that share one input, in order — (query, key, value),
attention.output.dense, intermediate.dense, output.dense — so that a pruning driver can collect
the statistics of each stage's input from the already pruned earlier stages (see
tilejit.calibrate)."""
import json
import math
import os
import unicodedata

import numpy as np

from . import safetensors

# The four stages of an encoder block: the layers in each share their input.
STAGES = (("attention.self.query", "attention.self.key", "attention.self.value"),
          ("attention.output.dense",), ("intermediate.dense",), ("output.dense",))

# Sixteen everyday sentences for examples and quick checks (not a quality measurement: that uses
# fortunes_corpus and corpus_split below).
SAMPLE_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street corner.",
    "The stock market fell sharply after the announcement.",
    "Researchers discovered a new species of frog in the rainforest.",
    "Please remember to water the plants while I am away.",
    "The train to Berlin leaves at seven o'clock tomorrow morning.",
    "She finished reading the novel in a single afternoon.",
    "Sparse matrix multiplication skips the zero weights.",
    "How many people live in the largest city of Canada?",
    "The children built a sandcastle on the beach.",
    "Heavy rain is expected across the region this weekend.",
    "He forgot his umbrella and got soaked on the way home.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Our team won the championship for the third year in a row.",
    "The museum opens a new exhibition on ancient Egypt next month.",
    "Can you recommend a good restaurant near the station?",
)


class WordPiece:
    """BERT's basic tokenizer + WordPiece over the model's vocab.txt (uncased)."""

    def __init__(self, vocab_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.vocab = {w.rstrip("\n"): i for i, w in enumerate(f)}

    @staticmethod
    def _basic(text):
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        out, word = [], ""
        for c in text:
            cp = ord(c)
            punct = (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
                     or unicodedata.category(c).startswith("P"))
            cjk = 0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF
            if c.isspace() or punct or cjk:
                if word:
                    out.append(word)
                word = ""
                if punct or cjk:
                    out.append(c)
            elif cp != 0 and cp != 0xFFFD and unicodedata.category(c) not in ("Cc", "Cf"):
                word += c
        if word:
            out.append(word)
        return out

    def _wordpiece(self, word):
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end, cur = len(word), None
            while start < end:
                sub = ("##" if start else "") + word[start:end]
                if sub in self.vocab:
                    cur = sub
                    break
                end -= 1
            if cur is None:
                return ["[UNK]"]
            pieces.append(cur)
            start = end
        return pieces

    def encode(self, text, max_len=128):
        toks = [p for w in self._basic(text) for p in self._wordpiece(w)][:max_len - 2]
        return [self.vocab["[CLS]"]] + [self.vocab[t] for t in toks] + [self.vocab["[SEP]"]]


def _row_blocks(fn, x, out):
    """fn(x[r0:r1], out[r0:r1]) over blocks of rows small enough to stay in cache (the element-wise
    chains pass over their arrays many times), the blocks spread over every core (NumPy's
    element-wise loops release the GIL). Each row's result does not depend on the others, so this
    is the same arithmetic as one call."""
    rows = x.shape[0]
    sub = max(16, 65536 // max(1, x.size // max(1, rows)))  # ~256 KB of float32 per array

    def run(r0, r1):
        for r in range(r0, r1, sub):
            fn(x[r:min(r + sub, r1)], out[r:min(r + sub, r1)])
    nt = min(_THREADS, max(1, rows // 256))
    if nt <= 1:
        run(0, rows)
        return out
    step = -(-rows // nt)
    list(_pool().map(lambda r: run(r, min(r + step, rows)), range(0, rows, step)))
    return out


_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
_POOL = None


def _pool():
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor
        _POOL = ThreadPoolExecutor(_THREADS)
    return _POOL


def layer_norm(x, w, b, eps):
    def rows(x, out):
        mu = x.mean(-1, keepdims=True)
        np.subtract(x, mu, out=out)
        var = np.square(out).mean(-1, keepdims=True)
        var += eps
        out /= np.sqrt(var)
        out *= w
        out += b
    return _row_blocks(rows, x, np.empty_like(x))


def _erf(x):
    """erf to 1.5e-7 (Abramowitz & Stegun 7.1.26): the same function for dense and pruned runs."""
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
               + 0.254829592) * t * np.exp(-a * a)
    return np.sign(x) * y


def _gelu_rows(x, out):
    """gelu of x into out: _erf's and gelu's operations in the same order, in place (no
    temporaries the size of x beyond two)."""
    a = np.divide(x, math.sqrt(2.0))
    np.sign(a, out=out)
    np.abs(a, out=a)
    t = 0.3275911 * a
    t += 1.0
    np.divide(1.0, t, out=t)
    p = 1.061405429 * t
    p -= 1.453152027
    p *= t
    p += 1.421413741
    p *= t
    p -= 0.284496736
    p *= t
    p += 0.254829592
    p *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    p *= a
    np.subtract(1.0, p, out=p)
    out *= p          # erf(x / √2)
    out += 1.0
    np.multiply(x, 0.5, out=a)
    out *= a


def gelu(x):
    return _row_blocks(_gelu_rows, x, np.empty_like(x))


def linear_names(config):
    """The encoder's linear layers in forward order (36 for a 6-layer model)."""
    return ["encoder.layer.%d.%s" % (i, n) for i in range(config["num_hidden_layers"]) for st in STAGES for n in st]


class Bert:
    """BertModel forward. weights: {tensor name: array}; dtype: float32 (fast) or float64."""

    def __init__(self, weights, config, linear=None, dtype=np.float32):
        self.w, self.c, self.dtype = weights, config, dtype
        self.linear = linear or self._linear
        self._cache = {}
        self.dir = None

    @classmethod
    def from_dir(cls, path, **kw):
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        m = cls(safetensors.load(os.path.join(path, "model.safetensors")), config, **kw)
        m.dir = path
        return m

    def set_weights(self, updates):
        """Replaces some tensors (e.g. a pruned layer's weight and bias)."""
        self.w = dict(self.w)
        self.w.update(updates)
        for name in updates:
            self._cache.pop((name, False), None)
            self._cache.pop((name, True), None)

    def _t(self, name, transpose=False):
        key = (name, transpose)
        a = self._cache.get(key)
        if a is None:
            a = np.asarray(self.w[name], dtype=self.dtype)
            a = np.ascontiguousarray(a.T if transpose else a)  # a linear weight as [k × n]: x @ a
            self._cache[key] = a
        return a

    def _linear(self, name, x):
        y = x @ self._t(name + ".weight", True)
        if self.w.get(name + ".bias") is not None:
            y += self._t(name + ".bias")
        return y

    # --- stages -----------------------------------------------------------------------------
    def embeddings(self, seqs):
        """Token stream [T × hidden] and sentence offsets (len(seqs) + 1) for token id lists."""
        ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])
        pos = np.concatenate([np.arange(len(s)) for s in seqs])
        offs = np.cumsum([0] + [len(s) for s in seqs])
        x = self._t("embeddings.word_embeddings.weight")[ids] + self._t("embeddings.position_embeddings.weight")[pos] \
            + self._t("embeddings.token_type_embeddings.weight")[0]
        x = layer_norm(x, self._t("embeddings.LayerNorm.weight"), self._t("embeddings.LayerNorm.bias"),
                       self.c["layer_norm_eps"])
        return x.astype(self.dtype), offs

    def attention(self, i, x, offs):
        """Stage 0 → the attention context (input of attention.output.dense)."""
        p = "encoder.layer.%d.attention.self." % i
        nh = self.c["num_attention_heads"]
        hd = self.c["hidden_size"] // nh
        q, k, v = (self.linear(p + n, x) for n in ("query", "key", "value"))
        ctx = np.empty_like(q)
        scale = 1.0 / math.sqrt(hd)
        # sentences of one length at a time: [B × heads × L × hd] batched products, each
        # sentence its own attention (no padding), far fewer Python steps than one per sentence;
        # the lengths are spread over the cores (NumPy releases the GIL in these loops)
        lens = np.diff(offs)

        def group(n):
            idx = (offs[:-1][lens == n][:, None] + np.arange(n)).reshape(-1)
            bsz = idx.size // n
            qs, ks, vs = (m[idx].reshape(bsz, n, nh, hd).transpose(0, 2, 1, 3) for m in (q, k, v))
            sc = qs @ ks.transpose(0, 1, 3, 2) * scale
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            ctx[idx] = (sc @ vs).transpose(0, 2, 1, 3).reshape(bsz * n, nh * hd)
        uniq = np.unique(lens)[::-1]  # longest first: the costliest groups start early
        if _THREADS > 1 and len(uniq) > 1:
            list(_pool().map(group, uniq))
        else:
            for n in uniq:
                group(n)
        return ctx

    def attention_out(self, i, ctx, x):
        """Stage 1 → h, the input of intermediate.dense."""
        p = "encoder.layer.%d.attention.output." % i
        return layer_norm(self.linear(p + "dense", ctx) + x, self._t(p + "LayerNorm.weight"),
                          self._t(p + "LayerNorm.bias"), self.c["layer_norm_eps"])

    def intermediate(self, i, h):
        """Stage 2 → f, the input of output.dense."""
        return gelu(self.linear("encoder.layer.%d.intermediate.dense" % i, h))

    def output(self, i, f, h):
        """Stage 3 → the block's output."""
        p = "encoder.layer.%d.output." % i
        return layer_norm(self.linear(p + "dense", f) + h, self._t(p + "LayerNorm.weight"), self._t(p + "LayerNorm.bias"),
                          self.c["layer_norm_eps"])

    def block(self, i, x, offs):
        h = self.attention_out(i, self.attention(i, x, offs), x)
        return self.output(i, self.intermediate(i, h), h)

    def forward_stream(self, seqs, start=0, x=None, offs=None):
        """Hidden states [T × hidden]; with start > 0, x is block `start`'s input."""
        if x is None:
            x, offs = self.embeddings(seqs)
        for i in range(start, self.c["num_hidden_layers"]):
            x = self.block(i, x, offs)
        return x, offs

    @staticmethod
    def pool(x, offs):
        """Mean pooling per sentence, L2-normalised (sentence-transformers' output)."""
        e = np.add.reduceat(x.astype(np.float64), offs[:-1], axis=0) / np.diff(offs)[:, None]
        return e / np.linalg.norm(e, axis=1, keepdims=True)

    def embed_batch(self, seqs, batch=64):
        out = []
        for s in range(0, len(seqs), batch):
            x, offs = self.forward_stream(seqs[s:s + batch])
            out.append(self.pool(x, offs))
        return np.concatenate(out)

    # --- one sentence at a time (scripts/quality's interface) -------------------------------
    def forward(self, ids):
        return self.forward_stream([ids])[0].astype(np.float64)

    def embed(self, ids):
        h = self.forward(ids)
        e = h.mean(0)
        return h, e / np.linalg.norm(e)


def fortunes_corpus(root="/usr/share/games/fortunes",
                    files=("fortunes", "wisdom", "people", "literature", "science", "computers", "education",
                           "food", "humorists", "miscellaneous", "platitudes", "work")):
    """Real English sentences from Debian's `fortunes` package: each fortune with its attribution
    line removed, whitespace collapsed, kept if 40-300 characters and mostly letters (no ASCII
    art); duplicates dropped. Returned sorted by SHA-1 of the text, a fixed pseudo-random order
    that does not depend on the files' order, so splits by position are deterministic."""
    import hashlib
    import re
    seen = set()
    for f in files:
        path = os.path.join(root, f)
        if not os.path.exists(path):
            raise FileNotFoundError("%s not found: install Debian's 'fortunes' package (scripts/install-deps)" % path)
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for e in text.split("\n%\n"):
            e = re.sub(r"\n\s*--.*$", "", e.strip(), flags=re.S)
            e = " ".join(e.split())
            if 40 <= len(e) <= 300 and sum(map(str.isalpha, e)) > 0.6 * len(e):
                seen.add(e)
    return sorted(seen, key=lambda s: hashlib.sha1(s.encode()).hexdigest())


def corpus_split(n_eval=600, n_calib=256, n_profile=32):
    """Disjoint deterministic splits of fortunes_corpus(): evaluation = the first n_eval in SHA-1
    order, calibration statistics = the next n_calib, allocation profile = the next n_profile."""
    c = fortunes_corpus()
    if len(c) < n_eval + n_calib + n_profile:
        raise ValueError("the fortunes corpus has %d sentences, fewer than %d" % (len(c), n_eval + n_calib + n_profile))
    return c[:n_eval], c[n_eval:n_eval + n_calib], c[n_eval + n_calib:n_eval + n_calib + n_profile]
