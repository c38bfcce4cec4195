#!/usr/bin/env python3
"""Writes a Llama-architecture GGUF (F16 matrices, F32 norms) with random
N(0, 0.02) weights and a given shape, default TinyLlama-1.1B:

  hidden 2048, 22 layers, 32 heads, 4 KV heads (head_dim 64), FFN 5632,
  vocab 32000, context 2048, RoPE theta 10000, RMSNorm eps 1e-5, untied output.

Random weights do not change speed, so the file is a stand-in for the real
model in benchmarks; libllm and llama.cpp both load it, and llama.cpp's
llama-quantize turns it into Q8_0 / Q4_0 files that libllm also reads
natively, so both engines run the very same bytes.

The vocabulary is a valid SentencePiece-style ("llama") one: <unk>, <s>,
</s>, the 256 byte tokens <0x00>..<0xFF>, then made-up pieces with
decreasing scores up to --vocab entries. Benchmarks feed random token ids,
so the pieces themselves do not matter.

Needs the `gguf` and `numpy` packages from PyPI:
  python3 -m venv venv && venv/bin/pip install gguf numpy
  venv/bin/python tests/bench/make_synthetic_gguf.py -o tl-f16.gguf
"""
import argparse
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("make_synthetic_gguf.py needs the 'gguf' package: pip install gguf numpy")


SHAPES = {
    # name: (dim, hidden, layers, heads, kv_heads, vocab, context)
    "tinyllama-1.1b": (2048, 5632, 22, 32, 4, 32000, 2048),
    "llama-3-8b": (4096, 14336, 32, 32, 8, 128256, 8192),
}


def make_vocab(n_vocab):
    tokens, scores, types = [], [], []
    specials = [("<unk>", gguf.TokenType.UNKNOWN), ("<s>", gguf.TokenType.CONTROL),
                ("</s>", gguf.TokenType.CONTROL)]
    for piece, kind in specials:
        tokens.append(piece)
        scores.append(0.0)
        types.append(kind)
    for b in range(256):
        tokens.append("<0x%02X>" % b)
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    # Unique pieces: "▁" + a base-26 word; lower scores for later (rarer) ones.
    i = 0
    while len(tokens) < n_vocab:
        word, k = "", i
        while True:
            word = chr(ord("a") + k % 26) + word
            k = k // 26 - 1
            if k < 0:
                break
        tokens.append("\u2581" + word)
        scores.append(-float(i))
        types.append(gguf.TokenType.NORMAL)
        i += 1
    return tokens, scores, types


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", required=True, help="output .gguf path")
    ap.add_argument("--shape", default="tinyllama-1.1b", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--std", type=float, default=0.02)
    args = ap.parse_args()

    dim, hidden, n_layers, n_heads, n_kv_heads, n_vocab, ctx = SHAPES[args.shape]
    head_dim = dim // n_heads
    rng = np.random.default_rng(args.seed)

    def matrix(rows, cols):
        # [rows, cols] row-major; GGUF stores ne0 = cols (the reversed shape).
        out = np.empty((rows, cols), dtype=np.float16)
        step = max(1, (1 << 24) // cols)  # ~64 MiB of f32 at a time
        for r in range(0, rows, step):
            block = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32)
            block *= args.std
            out[r:r + block.shape[0]] = block
        return out

    def ones(n):
        return np.ones(n, dtype=np.float32)

    w = gguf.GGUFWriter(args.output, "llama")
    w.add_name("synthetic-" + args.shape)
    w.add_description("random N(0, %g) weights, seed %d, shape of %s" % (args.std, args.seed, args.shape))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(ctx)
    w.add_embedding_length(dim)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(hidden)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)

    tokens, scores, types = make_vocab(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    w.add_tensor("token_embd.weight", matrix(n_vocab, dim))
    for i in range(n_layers):
        p = "blk.%d." % i
        w.add_tensor(p + "attn_norm.weight", ones(dim))
        w.add_tensor(p + "attn_q.weight", matrix(q_dim, dim))
        w.add_tensor(p + "attn_k.weight", matrix(kv_dim, dim))
        w.add_tensor(p + "attn_v.weight", matrix(kv_dim, dim))
        w.add_tensor(p + "attn_output.weight", matrix(dim, q_dim))
        w.add_tensor(p + "ffn_norm.weight", ones(dim))
        w.add_tensor(p + "ffn_gate.weight", matrix(hidden, dim))
        w.add_tensor(p + "ffn_up.weight", matrix(hidden, dim))
        w.add_tensor(p + "ffn_down.weight", matrix(dim, hidden))
    w.add_tensor("output_norm.weight", ones(dim))
    w.add_tensor("output.weight", matrix(n_vocab, dim))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
