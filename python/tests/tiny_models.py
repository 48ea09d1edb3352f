"""Tiny random models of the two families tilejit's pruning is proven on (a BERT encoder and a
LLaMA decoder, built by transformers from small configs), a word-level tokenizer for them, and
data: what the PyTorch pruning tests run on, on every machine, in seconds."""
import os

import torch
import transformers

transformers.logging.set_verbosity_error()

WORDS = ("the of and to a in is it you that he was for on are with as his they be at one have this from or had "
         "by word but what some we can out other were all there when up use your how said an each she which do "
         "their time if will way about many then them write would like so these her long make thing see him two "
         "has look more day could go come did number sound no most people my over know water than call first "
         "who may down side been now find any new work part take get place made live where after back little "
         "only round man year came show every good me give our under name very through just form sentence great "
         "think say help low line differ turn cause much mean before move right boy old too same tell does set "
         "three want air well also play small end put home read hand port large spell add even land here must "
         "big high such follow act why ask men change went light kind off need house picture try us again "
         "animal point mother world near build self earth father head stand own page should country found").split()


def tokenizer(d=None):
    """A word-level tokenizer over WORDS (+ [PAD] [UNK] [CLS] [SEP] [BOS] [EOS]); saved to d if given."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[BOS]", "[EOS]"] + list(WORDS))}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=t, pad_token="[PAD]", unk_token="[UNK]",
                                               cls_token="[CLS]", sep_token="[SEP]", bos_token="[BOS]",
                                               eos_token="[EOS]")
    if d:
        tok.save_pretrained(d)
    return tok


def _scaled(model, seed):
    """Per-input-feature scales on every linear layer's weights (as trained models have: features
    differ in importance), so that pruning has something to choose."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.mul_(torch.exp(torch.randn(m.in_features, generator=g) * 0.7))
                m.weight.mul_(2.0)
                if m.bias is not None:
                    m.bias.normal_(0, 0.1, generator=g)
    return model


def bert(seed=0, layers=2, hidden=64, heads=4, inter=128):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=len(WORDS) + 6, hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, intermediate_size=inter, max_position_embeddings=128,
                                  pad_token_id=0)
    return _scaled(transformers.BertModel(cfg, add_pooling_layer=True), seed).eval()


def llama(seed=0, layers=2, hidden=64, heads=4, kv_heads=2, inter=160):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=len(WORDS) + 6, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=inter,
                                   max_position_embeddings=128, tie_word_embeddings=True, bos_token_id=4,
                                   eos_token_id=5, pad_token_id=0)
    return _scaled(transformers.LlamaForCausalLM(cfg), seed).eval()


def sentences(n, seed=0, lo=4, hi=20):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        L = int(torch.randint(lo, hi, (1,), generator=g))
        out.append(" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (L,), generator=g)))
    return out


def save(model, tok, d):
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d
