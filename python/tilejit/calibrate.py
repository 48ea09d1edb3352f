"""Calibrated tile-wise pruning of a Hugging Face model on your own text: the command line of
tilejit.torch.prune (docs/pruning-torch.md).

    python -m tilejit.calibrate --model HF_DIR --data FILE --sparsity 0.5 --out OUT

The model is loaded with transformers (AutoModelForCausalLM for decoders, AutoModel otherwise;
a folder holding a .gguf file, or --gguf-file, through transformers' GGUF loader), the text is
tokenised with the model's own tokenizer and the model pruned in this process by
tilejit.torch.prune: statistics, measured allocation, sequential rebuild; the C library does the
maths. Text: --data FILE, one text per line, or JSON Lines with --text-field; encoders take
each line as one sample (padded per batch), decoders the whole text as one token stream cut into
chunks of --max-seq-len tokens. Without --data the text is Debian's fortunes (the first 600
sentences are held out for evaluation).

OUT receives the pruned model (save_pruned: pattern.json, model.safetensors under the model's
own tensor names, config.json, the tokenizer), report.json (per layer: density, error, time),
profile.json (the loss table) and summary.json; the summary is also printed as the last line.
--evaluate N measures the pruned model against the dense one: the mean embedding cosine on N
held-out sentences (encoders) or the perplexity on N chunks of held-out text (decoders; also one
greedy answer to --prompt, before and after)."""
import argparse
import glob
import json
import os
import sys
import time


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def load_model(path, gguf_file=None, dtype="float32"):
    """(model, tokenizer, is_causal_lm) from a Hugging Face folder or a GGUF file."""
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    kw = {"dtype": getattr(torch, dtype)}
    d = path
    if path.endswith(".gguf") and os.path.isfile(path):
        d, gguf_file = os.path.dirname(path) or ".", os.path.basename(path)
    elif gguf_file is None and os.path.isdir(path) and not os.path.exists(os.path.join(path, "config.json")):
        found = sorted(glob.glob(os.path.join(path, "*.gguf")))
        if found:
            gguf_file = os.path.basename(found[0])
    if not os.path.isdir(d):
        raise FileNotFoundError("%s: no such model folder" % d)
    if gguf_file:
        kw["gguf_file"] = gguf_file
    tok = transformers.AutoTokenizer.from_pretrained(d, **({"gguf_file": gguf_file} if gguf_file else {}))
    cfg = transformers.AutoConfig.from_pretrained(d, **({"gguf_file": gguf_file} if gguf_file else {}))
    causal = bool(gguf_file) or any(a.endswith("ForCausalLM") for a in (cfg.architectures or [])) or \
        bool(getattr(cfg, "is_decoder", False))
    cls = transformers.AutoModelForCausalLM if causal else transformers.AutoModel
    model = cls.from_pretrained(d, **kw).eval()
    if causal and tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok, causal


def batches_for(tok, texts, causal, n, max_len, batch_size):
    from . import data
    if causal:
        return data.token_chunks(tok, texts, n, max_len, batch_size)
    return data.sentence_batches(tok, texts[:n], batch_size, max_len)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tilejit.calibrate", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--model", required=True, help="a Hugging Face model folder (or a .gguf file, or a folder with one)")
    ap.add_argument("--gguf-file", default=None, help="the GGUF file's name inside --model")
    ap.add_argument("--out", required=True, help="output folder (replaced atomically)")
    ap.add_argument("--data", default=None, help="calibration text: one text per line, or JSON Lines (--text-field)")
    ap.add_argument("--text-field", default=None, help="the field of each JSON line holding its text (default text)")
    ap.add_argument("--sparsity", type=float, default=None, help="fraction of the pruned layers' weights removed")
    ap.add_argument("--budget-ms", type=float, default=None, help="a latency budget instead (at --latency tokens)")
    ap.add_argument("--latency", type=int, default=128, metavar="M", help="tokens per call for --budget-ms (128)")
    ap.add_argument("--mode", default="tw1", choices=["tw1", "tw2", "tew"])
    ap.add_argument("--ew", type=float, default=None, help="tew's residual fraction")
    ap.add_argument("--g", type=int, default=128, help="tile width (128)")
    ap.add_argument("--allocation", default="measured", choices=["measured", "uniform", "global"])
    ap.add_argument("--layers", default=None, help="regex on module names: the nn.Linear to prune (default all)")
    ap.add_argument("--ignore", default=None, help="regex on module names not to prune (default: output heads)")
    ap.add_argument("--num-samples", type=int, default=None,
                    help="calibration samples: sentences (encoders, default 1024) or chunks (decoders, default 128)")
    ap.add_argument("--max-seq-len", type=int, default=None,
                    help="tokens per sample: at most (encoders, default 128) or exactly (decoder chunks, default 256)")
    ap.add_argument("--batch-size", type=int, default=None, help="samples per batch (32 encoders, 8 decoders)")
    ap.add_argument("--profile-samples", type=int, default=None,
                    help="samples the measured allocation runs the model on (64 encoders, 16 decoders)")
    ap.add_argument("--steps", type=int, default=16, help="profile densities j/steps (16)")
    ap.add_argument("--measure", default=None,
                    help="the j of j/steps at which the profile runs the model (default: the target density and "
                         "half of it; 4,8 for --budget-ms); all: every j")
    ap.add_argument("--target", default="dense", choices=["dense", "own"],
                    help="rebuild each layer to reproduce the dense model's output (default) or its own")
    ap.add_argument("--residual", action=argparse.BooleanOptionalAction, default=True,
                    help="layers added to a residual also make up for its drift (default on)")
    ap.add_argument("--norm-refit", action=argparse.BooleanOptionalAction, default=None,
                    help="refit the norm after each such sum to the dense output (default: in post-norm "
                         "blocks only, as BERT's)")
    ap.add_argument("--sequential", action=argparse.BooleanOptionalAction, default=True,
                    help="prune group by group on the already pruned model's activations (default on)")
    ap.add_argument("--evaluate", type=int, default=0, metavar="N",
                    help="held-out sentences (encoders) or chunks (decoders) to measure quality on (0: none)")
    ap.add_argument("--eval-data", default=None, help="held-out text for --evaluate (default: fortunes' held-out part)")
    ap.add_argument("--prompt", default="What is the capital of France?", help="decoders: a greedy answer before and after")
    ap.add_argument("--damp", type=float, default=None, help="ridge damping of the statistics (0.001)")
    ap.add_argument("--threads", type=int, default=None, help="threads (default: torch.get_num_threads())")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the model's dtype")
    ap.add_argument("--tilejit", default=None, help="the tilejit command (for --budget-ms timing)")
    ap.add_argument("--recover", default="none", choices=["none", "block", "finetune"],
                    help="after pruning: block-local reconstruction of each block (block), then also "
                         "distillation fine-tuning against the dense model (finetune); default none")
    ap.add_argument("--recover-steps", type=int, default=200, help="Adam steps per block (200)")
    ap.add_argument("--recover-lr", type=float, default=1e-4, help="block reconstruction's learning rate (1e-4)")
    ap.add_argument("--finetune-steps", type=int, default=600, help="fine-tuning steps (600)")
    ap.add_argument("--finetune-lr", type=float, default=2e-4, help="fine-tuning's learning rate (2e-4)")
    ap.add_argument("--finetune-samples", type=int, default=None, metavar="N",
                    help="samples fine-tuning trains on (default: all of the calibration text)")
    ap.add_argument("--finetune-loss", default=None, choices=["hidden", "layers", "logits"],
                    help="fine-tuning's loss (default: logits for causal LMs, hidden for encoders)")
    ap.add_argument("--stats-out", default=None, metavar="FILE",
                    help="also write the dense model's calibration statistics (for tilejit prune --calibration)")
    a = ap.parse_args(argv)
    if (a.sparsity is None) == (a.budget_ms is None):
        ap.error("give exactly one of --sparsity and --budget-ms")
    try:
        return run(a)
    except (ValueError, FileNotFoundError, OSError, RuntimeError) as e:
        log("python -m tilejit.calibrate: %s" % e)
        return 1


def run(a):
    import torch
    from . import data
    from . import torch as tjt
    if a.threads:
        torch.set_num_threads(a.threads)
    t_all = time.perf_counter()
    for what, p in (("--data", a.data), ("--eval-data", a.eval_data)):
        if p is not None and not os.path.isfile(p):
            raise FileNotFoundError("%s %s: no such file" % (what, p))
    texts = data.read_texts(a.data, a.text_field) if a.data else None
    ev_texts = data.read_texts(a.eval_data, a.text_field) if a.eval_data and a.evaluate else None
    model, tok, causal = load_model(a.model, a.gguf_file, a.dtype)
    n_cal = a.num_samples or (128 if causal else 1024)
    n_prof = a.profile_samples if a.profile_samples is not None else (16 if causal else 64)
    max_len = a.max_seq_len or (256 if causal else 128)
    bs = a.batch_size or (8 if causal else 32)
    need = n_cal + (n_prof if a.allocation == "measured" else 0)
    n_eval = max(a.evaluate, 600)
    if a.data:
        source = a.data
    else:
        ev, cal, _ = data.corpus_split(n_eval, 0, 0)
        texts = data.fortunes_corpus()[n_eval:]
        source = "Debian fortunes (the first %d sentences held out)" % n_eval
    cal_batches = batches_for(tok, texts, causal, need, max_len, bs)
    log("calibrate: %s (%s), %d linear layers; calibration text: %s"
        % (a.model, "causal LM" if causal else "encoder",
           sum(isinstance(m, torch.nn.Linear) for m in model.modules()), source))
    quality = {}
    ev_batches = None
    if a.evaluate:
        if ev_texts is None:
            ev_texts = data.corpus_split(n_eval, 0, 0)[0]
        ev_batches = batches_for(tok, ev_texts, causal, a.evaluate, max_len, 64 if not causal else bs)
        t = time.perf_counter()
        if causal:
            quality["perplexity_dense"] = data.perplexity(model, ev_batches)
            quality["answer_dense"] = data.greedy(model, tok, a.prompt)
        else:
            dense_emb = data.embeddings(model, ev_batches)
        log("calibrate: dense model measured on the evaluation text (%.0f s)" % (time.perf_counter() - t))
    measure = a.measure if a.measure in (None, "all") else [int(v) for v in a.measure.split(",")]
    if a.stats_out:
        tjt.statistics(model, cal_batches, a.stats_out, layers=a.layers,
                       ignore=a.ignore if a.ignore is not None else tjt.DEFAULT_IGNORE, num_samples=n_cal,
                       max_seq_len=max_len, progress=log)
    rep = tjt.prune(model, cal_batches, sparsity=a.sparsity, budget_ms=a.budget_ms, mode=a.mode, g=a.g,
                    layers=a.layers, ignore=a.ignore if a.ignore is not None else tjt.DEFAULT_IGNORE,
                    num_samples=n_cal, max_seq_len=max_len, allocation=a.allocation, sequential=a.sequential,
                    target=a.target, residual=a.residual, norm_refit=a.norm_refit, profile_samples=n_prof,
                    steps=a.steps, measure=measure, latency_m=a.latency, threads=a.threads, damp=a.damp, ew=a.ew,
                    tilejit=a.tilejit, progress=log)
    log(str(rep))
    summary = {"model": os.path.basename(os.path.abspath(a.model).rstrip("/")), "kind": "causal LM" if causal else "encoder",
               "mode": a.mode, "g": a.g, "allocation": a.allocation, "sparsity": a.sparsity,
               "budget_ms": a.budget_ms, "density": rep.density, "calibration": source,
               "calibration_samples": rep.samples, "calibration_tokens": rep.tokens,
               "seconds": dict(rep.seconds), "recover": a.recover}

    def evaluate(stage):
        """The pruned model's quality now (after `stage`), against the dense model's."""
        t = time.perf_counter()
        if causal:
            quality["perplexity"] = data.perplexity(model, ev_batches)
            quality["perplexity_ratio"] = quality["perplexity"] / quality["perplexity_dense"]
            quality["answer"] = data.greedy(model, tok, a.prompt)
            quality["prompt"] = a.prompt
            quality["evaluation_tokens"] = sum(int(b["input_ids"].numel()) for b in ev_batches)
            log("calibrate: after %s: perplexity %.3f (dense %.3f, ratio %.3f) on %d held-out tokens; %r → %r "
                "(dense %r)" % (stage, quality["perplexity"], quality["perplexity_dense"], quality["perplexity_ratio"],
                                quality["evaluation_tokens"], a.prompt, quality["answer"], quality["answer_dense"]))
        else:
            quality["embedding_cosine"] = data.mean_cosine(data.embeddings(model, ev_batches), dense_emb)
            quality["evaluation_sentences"] = int(dense_emb.shape[0])
            log("calibrate: after %s: mean embedding cosine to dense on %d held-out sentences: %.4f"
                % (stage, quality["evaluation_sentences"], quality["embedding_cosine"]))
        quality["seconds"] = round(time.perf_counter() - t, 1)
        summary.setdefault("quality_by_stage", {})[stage] = {k: quality[k] for k in (
            "perplexity", "perplexity_ratio", "answer", "embedding_cosine") if k in quality}

    if a.evaluate:
        evaluate("the prune")
    if a.recover != "none":
        # recovery after the whole prune (so that the one-shot model's quality is measured first)
        teacher, _, _ = load_model(a.model, a.gguf_file, a.dtype)
        t = time.perf_counter()
        res = tjt.recover(model, teacher, cal_batches, num_samples=n_cal, max_seq_len=max_len,
                          steps=a.recover_steps, lr=a.recover_lr, progress=log)
        summary["seconds"]["block_recovery"] = round(time.perf_counter() - t, 1)
        summary["block_recovery"] = {"steps": sum(r["steps"] for r in res),
                                     "heldout_before": sum(r["heldout_before"] for r in res) / max(1, len(res)),
                                     "heldout_after": sum(r["heldout_after"] for r in res) / max(1, len(res))}
        if a.evaluate:
            evaluate("block recovery")
        if a.recover == "finetune":
            t = time.perf_counter()
            # an encoder's fine-tuning gains from all the text it is given, not only the calibration
            # samples; a decoder's keeps the calibration chunks (the teacher's logits are held in memory)
            n_ft = a.finetune_samples or (len(texts) if not causal else n_cal)
            ft_batches = batches_for(tok, texts, causal, n_ft, max_len, bs)
            summary["finetune"] = tjt.finetune(model, teacher, ft_batches, steps=a.finetune_steps, lr=a.finetune_lr,
                                               loss=a.finetune_loss, progress=log)
            summary["finetune"]["samples"] = sum(int(b["input_ids"].shape[0]) for b in ft_batches)
            summary["seconds"]["finetune"] = round(time.perf_counter() - t, 1)
            if a.evaluate:
                evaluate("fine-tuning")
        del teacher
    tjt.save_pruned(model, a.out, tokenizer=tok)
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(rep.to_dict(), f, indent=1)
    if rep.profile is not None:
        with open(os.path.join(a.out, "profile.json"), "w") as f:
            json.dump(rep.profile, f, indent=1)
    if a.evaluate:
        summary["quality"] = quality
    summary["seconds_total"] = round(time.perf_counter() - t_all, 1)
    from .sequential import peak_rss_gb
    summary["peak_rss_gb"] = round(peak_rss_gb(), 2)  # the whole command's, evaluation included
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
