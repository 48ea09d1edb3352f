"""End to end on a real model: all-MiniLM-L6-v2 (scripts/default-model) as a Hugging Face
transformers BertModel, pruned by tilejit (sparsify, tw1, 50 %), its 36 encoder linear layers
swapped for TWLinear; the sentence embeddings (mean pooling, L2-normalised, as
sentence-transformers computes them) must equal those of the same model with masked dense
weights: cosine ≥ 0.99999 for every sentence, on the CPU. With TJ_TILEJIT (the CLI), the
pattern `tilejit prune` writes from the checkpoint file must be the one sparsify() found from
the module's tensors. Exit 77 (skip) without PyTorch/transformers or the model files."""
import json
import os
import subprocess
import sys
import tempfile
import time

try:
    import torch
    import transformers
except ImportError as e:
    print("PyTorch or transformers is not installed (%s): skipping (scripts/install-torch installs them)" % e)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
import tilejit.torch as tjt  # noqa: E402
from tilejit.data import SAMPLE_SENTENCES as SENTENCES  # noqa: E402
from tilejit.torch import sentence_embeddings as embed  # noqa: E402

MODEL = os.environ.get("TJ_MINILM_DIR") or os.path.join(ROOT, "default-model", "all-MiniLM-L6-v2")
if not os.path.exists(os.path.join(MODEL, "model.safetensors")) or not os.path.exists(os.path.join(MODEL, "config.json")):
    print("all-MiniLM-L6-v2 not found in %s: skipping (scripts/default-model fetches it)" % MODEL)
    sys.exit(77)

ENCODER = (r"^encoder\.layer\.[0-9]+\.(attention\.(self\.(query|key|value)|output\.dense)|"
           r"intermediate\.dense|output\.dense)$")
SPARSITY = float(os.environ.get("TJ_SPARSITY", "0.5"))
BACKEND = os.environ.get("TJ_PY_BACKEND", "auto")


def main():
    torch.manual_seed(0)
    tok = transformers.AutoTokenizer.from_pretrained(MODEL)
    model = transformers.BertModel.from_pretrained(MODEL).eval()
    batch = tok(list(SENTENCES), padding=True, truncation=True, return_tensors="pt")
    dense = embed(model, batch)
    t0 = time.perf_counter()
    rep = tjt.sparsify(model, sparsity=SPARSITY, layers=ENCODER, backend=BACKEND)
    print(rep)
    print("sparsify: %.2f s" % (time.perf_counter() - t0))
    fails = []
    if len(rep.swapped) != 36:
        fails.append("swapped %d linear layers, expected 36" % len(rep.swapped))
    if isinstance(model.pooler.dense, tjt.TWLinear):
        fails.append("the pooler (not an encoder layer) was swapped")
    swapped = sum(isinstance(m, tjt.TWLinear) for m in model.modules())
    if swapped != 36:
        fails.append("%d TWLinear modules in the model, expected 36" % swapped)
    sparse = embed(model, batch)
    ref = embed(tjt.dense_copy(model), batch)
    cos = (sparse * ref).sum(1)
    cos_dense = (sparse * dense).sum(1)
    print("cosine(tilejit, masked dense) over %d sentences: min %.8f mean %.8f"
          % (len(SENTENCES), float(cos.min()), float(cos.mean())))
    print("cosine(tilejit, unpruned dense): min %.4f mean %.4f (pruning changes the model: "
          "tilejit's one-shot magnitude pruning, no reconstruction)" % (float(cos_dense.min()), float(cos_dense.mean())))
    if not bool((cos >= 0.99999).all()):
        fails.append("cosine to the masked dense model below 0.99999: %s" % cos.tolist())
    if not float(cos_dense.min()) < 0.9999:
        fails.append("the pruned model's embeddings equal the dense ones: nothing was pruned?")

    exe = os.environ.get("TJ_TILEJIT")
    if exe:  # the CLI's pruning of the checkpoint file gives the same pattern as the tensors'
        with tempfile.TemporaryDirectory() as d:
            pat = os.path.join(d, "p.json")
            r = subprocess.run([exe, "prune", "--weights", os.path.join(MODEL, "model.safetensors"),
                                "--sparsity", str(SPARSITY), "--layers", ENCODER, "-o", pat],
                               capture_output=True, text=True)
            if r.returncode != 0:
                fails.append("tilejit prune failed: " + r.stderr.strip())
            else:
                cli = {l["name"]: l for l in json.load(open(pat))["layers"]}
                mine = {m.layer["name"]: m.layer for m in model.modules() if isinstance(m, tjt.TWLinear)}
                diff = [n for n in mine if n not in cli or cli[n]["tiles"] != mine[n]["tiles"]]
                print("tilejit prune (CLI) vs sparsify: %d of %d layers differ" % (len(diff), len(mine)))
                if diff or len(cli) != len(mine):
                    fails.append("CLI pattern differs in layers %s" % diff[:5])
    for f in fails:
        print("FAIL:", f)
    print("PASS" if not fails else "FAILED")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
