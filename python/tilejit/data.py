"""Calibration and evaluation text for tilejit's pruning tools, and the quality measures reported
beside speed (docs/pruning-torch.md).

Built-in real text, split deterministically into disjoint parts so that no sentence is used both
to calibrate and to evaluate:
- `fortunes_corpus()`: sentences from Debian's `fortunes` package (the default for encoders, and
  for any model when the user gives no data);
- `handbook_corpus()`: paragraphs of The Debian Administrator's Handbook in English (Debian's
  `debian-handbook` package): long-form prose for causal language models, split by section.
User text: `read_texts(path, text_field)` reads text lines or JSON Lines.

Batches (what tilejit.torch.prune takes): `sentence_batches` pads sentences per batch (encoders);
`token_chunks` cuts one token stream into fixed-length chunks (causal LMs, no padding).
Measures: `embeddings` / `mean_cosine` (sentence embeddings as sentence-transformers computes
them), `perplexity`, `greedy` (one greedy generation). NumPy is enough for the corpora; the
rest needs PyTorch."""
import glob
import hashlib
import html.parser
import json
import os
import re

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

FORTUNES = "/usr/share/games/fortunes"
HANDBOOK = "/usr/share/doc/debian-handbook/html/en-US"


def _sha_order(items):
    return sorted(items, key=lambda s: hashlib.sha1(s.encode()).hexdigest())


def fortunes_corpus(root=FORTUNES,
                    files=("fortunes", "wisdom", "people", "literature", "science", "computers", "education",
                           "food", "humorists", "miscellaneous", "platitudes", "work")):
    """Real English sentences from Debian's `fortunes` package: each fortune with its attribution
    line removed, whitespace collapsed, kept if 40-300 characters and mostly letters (no ASCII
    art); duplicates dropped. Returned sorted by SHA-1 of the text, a fixed pseudo-random order
    that does not depend on the files' order, so splits by position are deterministic."""
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
    return _sha_order(seen)


def corpus_split(n_eval=600, n_calib=1024, n_profile=64):
    """Disjoint deterministic splits of fortunes_corpus(): evaluation = the first n_eval in SHA-1
    order, calibration = the next n_calib, allocation profile = the next n_profile."""
    c = fortunes_corpus()
    if len(c) < n_eval + n_calib + n_profile:
        raise ValueError("the fortunes corpus has %d sentences, fewer than %d" % (len(c), n_eval + n_calib + n_profile))
    return c[:n_eval], c[n_eval:n_eval + n_calib], c[n_eval + n_calib:n_eval + n_calib + n_profile]


class _Paragraphs(html.parser.HTMLParser):
    """The text of an HTML page's paragraphs (DocBook's <div class="para">, and <p>): running prose,
    not listings, tables or navigation."""

    def __init__(self):
        super().__init__()
        self.out, self.cur = [], []
        self.stack = []  # open div/p tags; True for the one that opened the current paragraph
        self.inside = 0

    def handle_starttag(self, tag, attrs):
        if tag not in ("div", "p"):
            return
        para = not self.inside and (tag == "p" or ("class", "para") in attrs) and ("id", "title") not in attrs
        self.stack.append(para)
        self.inside += para or bool(self.inside)

    def handle_endtag(self, tag):
        if tag not in ("div", "p") or not self.stack:
            return
        para = self.stack.pop()
        if self.inside:
            self.inside -= 1
        if para:
            t = " ".join("".join(self.cur).split())
            if len(t) >= 80 and sum(map(str.isalpha, t)) > 0.6 * len(t):
                self.out.append(t)
            self.cur = []
            self.inside = 0

    def handle_data(self, data):
        if self.inside:
            self.cur.append(data)


def handbook_corpus(root=HANDBOOK):
    """{section file name: [paragraphs]} of The Debian Administrator's Handbook (English), from
    Debian's `debian-handbook` package: the running text of each page's paragraphs."""
    pages = sorted(glob.glob(os.path.join(root, "*.html")))
    if not pages:
        raise FileNotFoundError("%s has no pages: install Debian's 'debian-handbook' package (scripts/install-deps)"
                                % root)
    out = {}
    for p in pages:
        parser = _Paragraphs()
        with open(p, encoding="utf-8", errors="replace") as f:
            parser.feed(f.read())
        if parser.out:
            out[os.path.basename(p)] = parser.out
    return out


def handbook_split(eval_fraction=0.25):
    """(evaluation text, calibration text): the handbook's sections in SHA-1 order of their file
    names, the first quarter (by count) for evaluation and the rest for calibration; whole
    sections, so no paragraph's neighbours leak across. Each part is one string, paragraphs
    separated by blank lines."""
    pages = handbook_corpus()
    names = _sha_order(pages)
    cut = max(1, int(round(len(names) * eval_fraction)))
    ev = "\n\n".join(p for n in names[:cut] for p in pages[n])
    cal = "\n\n".join(p for n in names[cut:] for p in pages[n])
    return ev, cal


def read_texts(path, text_field=None):
    """The texts of a user's file: one per non-empty line; or, when the file is JSON Lines (its
    first non-empty line starts with "{"), one per line, its field text_field (default "text")."""
    if not os.path.exists(path):
        raise FileNotFoundError("%s: no such file" % path)
    field = text_field or "text"
    out, jsonl = [], None
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if jsonl is None:
                jsonl = line.startswith("{")
            if jsonl:
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise ValueError("%s:%d: not a JSON line (%s)" % (path, i, e)) from None
                if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
                    raise ValueError("%s:%d: no text field '%s'%s" % (path, i, field,
                                     "" if text_field else " (name it with --text-field)"))
                line = obj[field]
            out.append(line)
    if not out:
        raise ValueError("%s holds no text" % path)
    return out


# ---- batches (PyTorch) ----------------------------------------------------------------------

def sentence_batches(tokenizer, sentences, batch_size=32, max_len=128):
    """Tokenised batches of sentences, padded per batch (attention_mask marks the padding)."""
    out = []
    for i in range(0, len(sentences), batch_size):
        enc = tokenizer(list(sentences[i:i + batch_size]), padding=True, truncation=True, max_length=max_len,
                        return_tensors="pt")
        out.append({k: v for k, v in enc.items()})
    return out


def token_chunks(tokenizer, text, n_chunks, seq_len, batch_size=8):
    """The first n_chunks chunks of seq_len tokens of one token stream (text: a string, or a list
    of strings joined by blank lines), in batches of batch_size: {"input_ids"} only, no padding.
    Fewer chunks when the text runs out."""
    import torch
    if not isinstance(text, str):
        text = "\n\n".join(text)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    n = min(n_chunks, ids.numel() // seq_len)
    if n < 1:
        raise ValueError("the text has %d tokens, fewer than one chunk of %d" % (ids.numel(), seq_len))
    chunks = ids[:n * seq_len].view(n, seq_len)
    return [{"input_ids": chunks[i:i + batch_size].clone(), "attention_mask": torch.ones_like(chunks[i:i + batch_size])}
            for i in range(0, n, batch_size)]


# ---- quality measures (PyTorch) ---------------------------------------------------------------

def embeddings(model, batches):
    """Sentence embeddings (the last hidden state mean-pooled over real tokens, L2-normalised, as
    sentence-transformers computes them for all-MiniLM-L6-v2), one row per sentence."""
    import torch
    out = []
    with torch.no_grad():
        for b in batches:
            h = model(**b).last_hidden_state
            m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
            out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=1))
    return torch.cat(out)


def mean_cosine(e, ref):
    """Mean cosine of L2-normalised embedding rows to their references."""
    return float((e * ref).sum(1).mean())


def perplexity(model, batches):
    """exp(mean next-token negative log-likelihood) of a causal LM over token chunks."""
    import torch
    nll, count = 0.0, 0
    with torch.no_grad():
        for b in batches:
            ids = b["input_ids"]
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1)
            tgt = ids[:, 1:]
            nll -= float(lp.gather(-1, tgt.unsqueeze(-1)).sum())
            count += tgt.numel()
    import math
    return math.exp(nll / max(count, 1))


def greedy(model, tokenizer, prompt, max_new_tokens=24, chat=True):
    """One greedy generation (the answer only) for a prompt, through the tokenizer's chat
    template when it has one."""
    import torch
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    else:
        text = prompt
    enc = tokenizer(text, return_tensors="pt", add_special_tokens=not chat)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    return tokenizer.decode(out[0][enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()
