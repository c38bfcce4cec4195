#!/usr/bin/env python3
"""Write tiny random-weight GGUF models, one per model family, for the
family logit tests (tests/data/families/).

Every model is F32 throughout, uses the 512-token SentencePiece vocabulary of
stories260K.gguf, and is made from a fixed numpy seed, so running this script
again writes byte-identical files (given the same gguf and numpy packages).

usage:
  make_family_models.py --vocab /path/to/stories260K.gguf --out DIR
                        [--prompts FILE] [--only NAME[,NAME...]]

--prompts FILE also writes the test prompts (one per line, token ids separated
by spaces), shared by all families.
"""
import argparse
import os
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("needs the gguf package: pip install gguf")

N_VOCAB = 512
BOS = 1
PROMPT_LENGTHS = (6, 19, 45)
PROMPT_SEED = 20240611

# One entry per model file. Shapes are chosen so that each family's distinctive
# features are active; `std` scales are chosen so that the features change the
# logits well beyond float32 noise and the greedy continuations are not
# degenerate (see tests/data/families/README.md).
FAMILIES = [
    dict(name="llama", arch="llama", seed=101,
         n_embd=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=16, n_ff=128,
         rms_eps=1e-5, rope_base=10000.0, tied=False,
         std=dict(emb=1.0, attn=0.10, ffn=0.10, out=0.10)),
    dict(name="llama3", arch="llama", seed=102,
         n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=16, n_ff=128,
         rms_eps=1e-5, rope_base=500000.0, tied=True, rope_freqs=(1.0, 8.0),
         std=dict(emb=0.15, attn=0.25, ffn=0.15, out=0.15)),
    dict(name="qwen2", arch="qwen2", seed=103,
         n_embd=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=16, n_ff=128,
         rms_eps=1e-6, rope_base=1000000.0, tied=True, qkv_bias=0.25,
         std=dict(emb=0.15, attn=0.20, ffn=0.15, out=0.15)),
    dict(name="qwen3", arch="qwen3", seed=104,
         n_embd=32, n_layer=3, n_head=4, n_head_kv=2, head_dim=16, n_ff=96,
         rms_eps=1e-6, rope_base=1000000.0, tied=False, qk_norm=True,
         std=dict(emb=1.0, attn=0.15, ffn=0.15, out=0.15)),
    dict(name="gemma2", arch="gemma2", seed=105,
         n_embd=32, n_layer=6, n_head=4, n_head_kv=2, head_dim=16, n_ff=128,
         rms_eps=1e-6, rope_base=10000.0, tied=True, post_norms=True,
         sliding_window=8, attn_softcap=5.0, final_softcap=2.0,
         std=dict(emb=0.10, attn=0.50, ffn=0.15, out=0.10)),
    dict(name="gemma3", arch="gemma3", seed=106,
         n_embd=32, n_layer=6, n_head=2, n_head_kv=1, head_dim=32, n_ff=128,
         rms_eps=1e-6, rope_base=1000000.0, rope_base_swa=10000.0, tied=True,
         post_norms=True, qk_norm=True, sliding_window=8,
         std=dict(emb=0.07, attn=0.15, ffn=0.20, out=0.07)),
    dict(name="phi3", arch="phi3", seed=107,
         n_embd=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=16, n_rot=12,
         n_ff=128, rms_eps=1e-5, rope_base=10000.0, tied=False,
         fused_qkv=True, fused_gate_up=True,
         std=dict(emb=1.0, attn=0.12, ffn=0.10, out=0.10)),
    # YaRN: factor 4 over an original context of 512, so pairs 0-4 of 8 blend
    # (corr dims 0 and 4 at base 10000) and q, k are scaled by 1 + 0.1 ln 4.
    dict(name="qwen2_yarn", arch="qwen2", seed=108,
         n_embd=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=16, n_ff=128,
         rms_eps=1e-6, rope_base=10000.0, tied=True, qkv_bias=0.25,
         yarn=dict(factor=4.0, orig_ctx=512),
         std=dict(emb=0.15, attn=0.25, ffn=0.15, out=0.15)),
    # LongRoPE: long factors apply (context 2048 > original 256, llama.cpp at
    # n_ctx 512 > 256 too), attention factor sqrt(1 + ln(2048/256) / ln 256).
    dict(name="phi3_longrope", arch="phi3", seed=109,
         n_embd=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=16, n_rot=12,
         n_ff=128, rms_eps=1e-5, rope_base=10000.0, tied=False,
         fused_qkv=True, fused_gate_up=True,
         longrope=dict(orig_ctx=256, long=(1.0, 16.0), short=(1.0, 1.5)),
         std=dict(emb=1.0, attn=0.20, ffn=0.10, out=0.10)),
]


def read_vocab(path):
    r = gguf.GGUFReader(path)

    def field(name):
        f = r.fields[name]
        return f.contents()

    tokens = field("tokenizer.ggml.tokens")
    scores = [float(x) for x in field("tokenizer.ggml.scores")]
    ttype = [int(x) for x in field("tokenizer.ggml.token_type")]
    if len(tokens) != N_VOCAB:
        sys.exit(f"{path}: expected {N_VOCAB} tokens, found {len(tokens)}")
    return dict(model=field("tokenizer.ggml.model"), tokens=tokens, scores=scores, token_type=ttype,
                bos=int(field("tokenizer.ggml.bos_token_id")), eos=int(field("tokenizer.ggml.eos_token_id")),
                unk=int(field("tokenizer.ggml.unknown_token_id")))


def make_prompts():
    rng = np.random.default_rng(PROMPT_SEED)
    return [[BOS] + [int(t) for t in rng.integers(3, N_VOCAB, size=n - 1)] for n in PROMPT_LENGTHS]


def norm_weight(rng, n):
    # Stored as the plain multiplier (llama.cpp's gemma converters already add the 1).
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def matrix(rng, n_out, n_in, std):
    # numpy shape (rows=out, cols=in) == GGUF ne [in, out]; y = W @ x.
    return (std * rng.standard_normal((n_out, n_in))).astype(np.float32)


def build_tensors(cfg):
    """Returns an ordered list of (name, float32 array)."""
    rng = np.random.default_rng(cfg["seed"])
    d, hd, nh, nkv, ff = cfg["n_embd"], cfg["head_dim"], cfg["n_head"], cfg["n_head_kv"], cfg["n_ff"]
    s = cfg["std"]
    t = []
    t.append(("token_embd.weight", (s["emb"] * rng.standard_normal((N_VOCAB, d))).astype(np.float32)))
    if "rope_freqs" in cfg:
        lo, hi = cfg["rope_freqs"]
        t.append(("rope_freqs.weight", rng.uniform(lo, hi, size=hd // 2).astype(np.float32)))
    if "longrope" in cfg:
        n_pairs = cfg.get("n_rot", hd) // 2
        for kind in ("long", "short"):
            lo, hi = cfg["longrope"][kind]
            t.append((f"rope_factors_{kind}.weight", rng.uniform(lo, hi, size=n_pairs).astype(np.float32)))
    for i in range(cfg["n_layer"]):
        p = f"blk.{i}."
        t.append((p + "attn_norm.weight", norm_weight(rng, d)))
        wq = matrix(rng, nh * hd, d, s["attn"])
        wk = matrix(rng, nkv * hd, d, s["attn"])
        wv = matrix(rng, nkv * hd, d, s["attn"])
        if cfg.get("fused_qkv"):
            t.append((p + "attn_qkv.weight", np.concatenate([wq, wk, wv], axis=0)))
        else:
            t.append((p + "attn_q.weight", wq))
            t.append((p + "attn_k.weight", wk))
            t.append((p + "attn_v.weight", wv))
        if cfg.get("qkv_bias"):
            b = cfg["qkv_bias"]
            t.append((p + "attn_q.bias", (b * rng.standard_normal(nh * hd)).astype(np.float32)))
            t.append((p + "attn_k.bias", (b * rng.standard_normal(nkv * hd)).astype(np.float32)))
            t.append((p + "attn_v.bias", (b * rng.standard_normal(nkv * hd)).astype(np.float32)))
        if cfg.get("qk_norm"):
            t.append((p + "attn_q_norm.weight", norm_weight(rng, hd)))
            t.append((p + "attn_k_norm.weight", norm_weight(rng, hd)))
        t.append((p + "attn_output.weight", matrix(rng, d, nh * hd, s["attn"])))
        if cfg.get("post_norms"):
            t.append((p + "post_attention_norm.weight", norm_weight(rng, d)))
        t.append((p + "ffn_norm.weight", norm_weight(rng, d)))
        wg = matrix(rng, ff, d, s["ffn"])
        wu = matrix(rng, ff, d, s["ffn"])
        if cfg.get("fused_gate_up"):
            # Phi-3 layout: rows [0, n_ff) are the gate (SiLU applied), rows [n_ff, 2 n_ff) the up projection.
            t.append((p + "ffn_up.weight", np.concatenate([wg, wu], axis=0)))
        else:
            t.append((p + "ffn_gate.weight", wg))
            t.append((p + "ffn_up.weight", wu))
        t.append((p + "ffn_down.weight", matrix(rng, d, ff, s["ffn"])))
        if cfg.get("post_norms"):
            t.append((p + "post_ffw_norm.weight", norm_weight(rng, d)))
    t.append(("output_norm.weight", norm_weight(rng, d)))
    if not cfg["tied"]:
        t.append(("output.weight", matrix(rng, N_VOCAB, d, s["out"])))
    return t


def metadata(cfg):
    """Returns an ordered list of (key, kind, value) for the architecture keys."""
    a = cfg["arch"]
    m = [
        (f"{a}.context_length", "u32", 2048),
        (f"{a}.embedding_length", "u32", cfg["n_embd"]),
        (f"{a}.block_count", "u32", cfg["n_layer"]),
        (f"{a}.feed_forward_length", "u32", cfg["n_ff"]),
        (f"{a}.attention.head_count", "u32", cfg["n_head"]),
        (f"{a}.attention.head_count_kv", "u32", cfg["n_head_kv"]),
        (f"{a}.attention.layer_norm_rms_epsilon", "f32", cfg["rms_eps"]),
        (f"{a}.rope.freq_base", "f32", cfg["rope_base"]),
        (f"{a}.rope.dimension_count", "u32", cfg.get("n_rot", cfg["head_dim"])),
    ]
    if cfg["head_dim"] * cfg["n_head"] != cfg["n_embd"] or a.startswith("gemma"):
        m.append((f"{a}.attention.key_length", "u32", cfg["head_dim"]))
        m.append((f"{a}.attention.value_length", "u32", cfg["head_dim"]))
    if "sliding_window" in cfg:
        m.append((f"{a}.attention.sliding_window", "u32", cfg["sliding_window"]))
    if "rope_base_swa" in cfg:
        m.append((f"{a}.rope.freq_base_swa", "f32", cfg["rope_base_swa"]))
    if "attn_softcap" in cfg:
        m.append((f"{a}.attn_logit_softcapping", "f32", cfg["attn_softcap"]))
    if "final_softcap" in cfg:
        m.append((f"{a}.final_logit_softcapping", "f32", cfg["final_softcap"]))
    if "yarn" in cfg:
        m.append((f"{a}.rope.scaling.type", "str", "yarn"))
        m.append((f"{a}.rope.scaling.factor", "f32", cfg["yarn"]["factor"]))
        m.append((f"{a}.rope.scaling.original_context_length", "u32", cfg["yarn"]["orig_ctx"]))
    if "longrope" in cfg:
        orig = cfg["longrope"]["orig_ctx"]
        m.append((f"{a}.rope.scaling.type", "str", "longrope"))
        m.append((f"{a}.rope.scaling.original_context_length", "u32", orig))
        m.append((f"{a}.rope.scaling.attn_factor", "f32", float(np.sqrt(1 + np.log(2048 / orig) / np.log(orig)))))
    return m


def write_model(cfg, vocab, path):
    w = gguf.GGUFWriter(path, cfg["arch"])
    # general.name must not contain "phi3"/"phi-3": llama.cpp then looks up Phi-3 special tokens.
    w.add_string("general.name", "libllm family test model (random weights)")
    w.add_uint32("general.file_type", 0)  # all F32
    for key, kind, val in metadata(cfg):
        if kind == "u32":
            w.add_uint32(key, int(val))
        elif kind == "str":
            w.add_string(key, val)
        else:
            w.add_float32(key, float(val))
    w.add_string("tokenizer.ggml.model", vocab["model"])
    w.add_array("tokenizer.ggml.tokens", vocab["tokens"])
    w.add_array("tokenizer.ggml.scores", vocab["scores"])
    w.add_array("tokenizer.ggml.token_type", vocab["token_type"])
    w.add_uint32("tokenizer.ggml.bos_token_id", vocab["bos"])
    w.add_uint32("tokenizer.ggml.eos_token_id", vocab["eos"])
    w.add_uint32("tokenizer.ggml.unknown_token_id", vocab["unk"])
    for name, arr in build_tensors(cfg):
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", required=True, help="stories260K.gguf (source of the tokenizer.* metadata)")
    ap.add_argument("--out", required=True, help="directory for <name>.gguf")
    ap.add_argument("--prompts", help="also write the prompts here")
    ap.add_argument("--only", help="comma-separated family names")
    args = ap.parse_args()
    vocab = read_vocab(args.vocab)
    os.makedirs(args.out, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    for cfg in FAMILIES:
        if only and cfg["name"] not in only:
            continue
        path = os.path.join(args.out, cfg["name"] + ".gguf")
        write_model(cfg, vocab, path)
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    if args.prompts:
        with open(args.prompts, "w") as f:
            for p in make_prompts():
                f.write(" ".join(str(x) for x in p) + "\n")
        print(f"wrote {args.prompts}")


if __name__ == "__main__":
    main()
