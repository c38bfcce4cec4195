#!/usr/bin/env python3
"""Independent numpy forward pass for the family test models (tests/data/families/).

It re-derives the logits of every case in <name>.json from <name>.gguf, using the
math that llama.cpp applies for the GGUF architecture (written out below), and
reports the largest difference from llama.cpp's logits. With --effects it also
switches single features off (rope factors, biases, QK-norm, softcaps, sliding
window, ...) and reports how much each one moves the logits, to show that the
test data really exercises it.

usage: family_numpy_check.py [--effects] DIR/<name>.json [...]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import gguf

NEOX_ARCHS = {"qwen2", "qwen3", "gemma2", "gemma3", "phi3"}


def load(path):
    r = gguf.GGUFReader(path)
    kv = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer."):
            continue
        c = f.contents()
        kv[k] = c
    t = {}
    for ten in r.tensors:
        a = np.array(ten.data, dtype=np.float64)
        t[ten.name] = a.reshape([int(x) for x in reversed(ten.shape)]) if a.ndim == 1 and len(ten.shape) > 1 else a
    return kv, t


def hparams(kv):
    a = kv["general.architecture"]
    g = lambda k, d=None: kv.get(f"{a}.{k}", d)
    n_embd, n_head = g("embedding_length"), g("attention.head_count")
    hd = g("attention.key_length", n_embd // n_head)
    n_layer = g("block_count")
    hp = dict(arch=a, n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=g("attention.head_count_kv", n_head),
              head_dim=hd, n_rot=g("rope.dimension_count", hd), eps=g("attention.layer_norm_rms_epsilon"),
              base=g("rope.freq_base", 10000.0), attn_softcap=None, final_softcap=g("final_logit_softcapping"),
              n_swa=0, swa=[False] * n_layer, base_swa=None)
    if a == "gemma2":
        hp["attn_softcap"] = g("attn_logit_softcapping", 50.0)
        hp["final_softcap"] = g("final_logit_softcapping", 30.0)
        hp["n_swa"] = g("attention.sliding_window", 4096)
        pat = g("attention.sliding_window_pattern", 2)
        hp["swa"] = [il % pat < pat - 1 for il in range(n_layer)]          # even layers slide
        hp["base_swa"] = g("rope.freq_base_swa", hp["base"])
    if a == "gemma3" and g("attention.sliding_window", 0):
        hp["n_swa"] = g("attention.sliding_window")
        pat = g("attention.sliding_window_pattern", 6)
        hp["swa"] = [il % pat < pat - 1 for il in range(n_layer)]          # 5 of every 6 slide
        hp["base_swa"] = g("rope.freq_base_swa", 10000.0)
    if a.startswith("gemma"):
        hp["q_scale"] = 1.0 / math.sqrt(hd)  # (27B: n_embd/n_head; detected by n_layer == 46 / 62)
    else:
        hp["q_scale"] = 1.0 / math.sqrt(hd)
    hp["neox"] = a in NEOX_ARCHS
    # RoPE scaling (YaRN / LongRoPE), as llama.cpp reads it.
    hp["scaling"] = g("rope.scaling.type", "")
    hp["factor"] = g("rope.scaling.factor", 1.0)
    hp["orig_ctx"] = g("rope.scaling.original_context_length", g("context_length"))
    hp["ctx"] = g("context_length")
    hp["attn_factor"] = g("rope.scaling.attn_factor", 1.0)
    return hp


def yarn_inv_freq(inv, n_rot, base, factor, orig_ctx, beta_fast=32.0, beta_slow=1.0):
    # Pair i turns pos * inv[i] radians; over the original context it completes
    # orig_ctx * inv[i] / (2 pi) turns. Pairs with more than beta_fast turns keep
    # inv[i], pairs with fewer than beta_slow take inv[i] / factor, linear in i between
    # (the bounds rounded outwards to whole pairs, as in the YaRN paper's code).
    def pair_at(turns):
        return n_rot * math.log(orig_ctx / (turns * 2 * math.pi)) / (2 * math.log(base))
    lo = max(0.0, math.floor(pair_at(beta_fast)))
    hi = min(n_rot - 1.0, math.ceil(pair_at(beta_slow)))
    i = np.arange(len(inv), dtype=np.float64)
    keep = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)
    return inv * (keep + (1.0 - keep) / factor)


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)))


def gelu_ggml(x):
    # ggml CPU: x rounded to fp16, table lookup of fp16(gelu(x16)); |x| >= 10 handled exactly.
    x16 = x.astype(np.float16).astype(np.float32)
    y = gelu_tanh(x16.astype(np.float64)).astype(np.float32).astype(np.float16).astype(np.float64)
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y))


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope(x, pos, n_rot, base, neox, factors=None, yarn=None, mscale=1.0):
    # x: [T, H, D]; rotates the first n_rot dims; theta_i = pos * base^(-2i/n_rot) / factors[i]
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot)
    if factors is not None:
        inv = inv / factors
    if yarn is not None:
        inv = yarn_inv_freq(inv, n_rot, base, *yarn)
    ang = pos[:, None] * inv[None, :]
    # The attention factor scales cos and sin: the rotated dims only.
    c, s = mscale * np.cos(ang)[:, None, :], mscale * np.sin(ang)[:, None, :]
    y = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        y[..., :half], y[..., half:n_rot] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        y[..., 0:n_rot:2], y[..., 1:n_rot:2] = a * c - b * s, a * s + b * c
    return y


def forward(hp, t, ids, off=()):
    """Logits [T, V] for token ids at positions 0..T-1. `off` names features to switch off."""
    a, d, H, KV, hd = hp["arch"], hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    eps, T = hp["eps"], len(ids)
    pos = np.arange(T, dtype=np.float64)
    gelu = gelu_tanh if "gelu_fp16" in off else gelu_ggml
    h = t["token_embd.weight"][ids].copy()
    if a.startswith("gemma") and "embed_scale" not in off:
        h *= float(np.sqrt(np.float32(d)))
    factors = t.get("rope_freqs.weight") if "rope_freqs" not in off else None
    if "rope_factors_long.weight" in t:  # LongRoPE: long factors when the context is over the original
        long = hp["ctx"] > hp["orig_ctx"]
        if "longrope_choice" in off:
            long = not long
        factors = t["rope_factors_long.weight" if long else "rope_factors_short.weight"]
        if "longrope" in off:
            factors = None
    yarn = None
    mscale = hp["attn_factor"] if "attn_factor" not in off else 1.0
    if hp["scaling"] == "yarn":
        if "yarn_ramp" not in off:
            yarn = (hp["factor"], hp["orig_ctx"])
        if "attn_factor" not in off and hp["factor"] > 1:
            mscale *= 1.0 + 0.1 * math.log(hp["factor"])
    n_rot = hd if "partial_rotary" in off else hp["n_rot"]
    for il in range(hp["n_layer"]):
        p = f"blk.{il}."
        L = lambda n: t.get(p + n)
        x = rms(h, L("attn_norm.weight"), eps)
        if L("attn_qkv.weight") is not None:
            qkv = x @ L("attn_qkv.weight").T
            q, k, v = np.split(qkv, [H * hd, H * hd + KV * hd], axis=1)
        else:
            q, k, v = x @ L("attn_q.weight").T, x @ L("attn_k.weight").T, x @ L("attn_v.weight").T
        if L("attn_q.bias") is not None and "qkv_bias" not in off:
            q, k, v = q + L("attn_q.bias"), k + L("attn_k.bias"), v + L("attn_v.bias")
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if L("attn_q_norm.weight") is not None and "qk_norm" not in off:
            q, k = rms(q, L("attn_q_norm.weight"), eps), rms(k, L("attn_k_norm.weight"), eps)
        swa = hp["swa"][il] and "window" not in off
        if "swa_pattern" in off:  # wrong pattern: the opposite layers slide
            swa = not hp["swa"][il]
        base = hp["base_swa"] if (hp["swa"][il] and hp["base_swa"] is not None and "swa_base" not in off) else hp["base"]
        neox = hp["neox"] != ("rope_style" in off)
        q = rope(q, pos, n_rot, base, neox, factors, yarn, mscale)
        k = rope(k, pos, n_rot, base, neox, factors, yarn, mscale)
        scale = 1.0 / math.sqrt(d / H) if "q_scale" in off else hp["q_scale"]
        grp = H // KV
        mask = np.tril(np.ones((T, T), dtype=bool))
        if swa:
            mask &= (pos[:, None] - pos[None, :]) < hp["n_swa"]
        out = np.empty((T, H, hd))
        for hh in range(H):
            kh = (hh % KV) if "gqa_map" in off else hh // grp
            s = (q[:, hh, :] * scale) @ k[:, kh, :].T
            if hp["attn_softcap"] and "attn_softcap" not in off:
                s = hp["attn_softcap"] * np.tanh(s / hp["attn_softcap"])
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            out[:, hh, :] = s @ v[:, kh, :]
        o = out.reshape(T, H * hd) @ L("attn_output.weight").T
        if L("post_attention_norm.weight") is not None and "post_norms" not in off:
            o = rms(o, L("post_attention_norm.weight"), eps)
        h = h + o
        x = rms(h, L("ffn_norm.weight"), eps)
        if L("ffn_gate.weight") is None:  # phi3 fused [gate; up]
            gu = x @ L("ffn_up.weight").T
            g, u = np.split(gu, 2, axis=1)
            if "gate_up_order" in off:
                g, u = u, g
            f = silu(g) * u
        else:
            g, u = x @ L("ffn_gate.weight").T, x @ L("ffn_up.weight").T
            f = (gelu(g) if a.startswith("gemma") else silu(g)) * u
        f = f @ L("ffn_down.weight").T
        if L("post_ffw_norm.weight") is not None and "post_norms" not in off:
            f = rms(f, L("post_ffw_norm.weight"), eps)
        h = h + f
    x = rms(h, t["output_norm.weight"], eps)
    W = t["output.weight"] if "output.weight" in t else t["token_embd.weight"]
    lg = x @ W.T
    if hp["final_softcap"] and "final_softcap" not in off:
        c = hp["final_softcap"]
        lg = c * np.tanh(lg / c)
    return lg


EFFECTS = {
    "llama": ["gqa_map", "rope_style"],
    "llama3": ["rope_freqs", "rope_style"],
    "qwen2": ["qkv_bias", "rope_style"],
    "qwen3": ["qk_norm", "rope_style", "gqa_map"],
    "gemma2": ["attn_softcap", "final_softcap", "window", "swa_pattern", "embed_scale", "q_scale", "post_norms",
               "gelu_fp16"],
    "gemma3": ["window", "swa_pattern", "swa_base", "qk_norm", "embed_scale", "q_scale", "post_norms", "gelu_fp16"],
    "phi3": ["partial_rotary", "gate_up_order", "rope_style", "gqa_map"],
    "qwen2_yarn": ["yarn_ramp", "attn_factor", "qkv_bias"],
    "phi3_longrope": ["longrope", "longrope_choice", "attn_factor"],
}


def check(path, effects):
    ref = json.load(open(path))
    d = os.path.dirname(path)
    kv, t = load(os.path.join(d, ref["model_file"]))
    hp = hparams(kv)
    worst, worst_rel, bad_greedy = 0.0, 0.0, 0
    eff = {e: 0.0 for e in (EFFECTS.get(os.path.splitext(os.path.basename(path))[0], []) if effects else [])}
    margins, n_rows, distinct = [], 0, set()
    for c in ref["cases"]:
        ids = c["prompt_token_ids"] + c["generated_token_ids"]
        want = np.array(c["prompt_logits"] + c["generated_logits"], dtype=np.float64)
        got = forward(hp, t, ids)
        diff = np.abs(got - want).max()
        worst = max(worst, diff)
        worst_rel = max(worst_rel, diff / np.abs(want).max())
        n = len(c["prompt_token_ids"])
        # greedy ids: argmax of the row before each generated token
        for kk, tok in enumerate(c["generated_token_ids"]):
            row = want[n - 1 + kk]
            if int(np.argmax(row)) != tok:
                bad_greedy += 1
        distinct.update(c["generated_token_ids"])
        srt = np.sort(want, axis=1)
        margins.extend((srt[:, -1] - srt[:, -2]).tolist())
        n_rows += len(want)
        for e in eff:
            eff[e] = max(eff[e], float(np.abs(forward(hp, t, ids, off=(e,)) - want).max()))
    m = np.array(margins)
    print(f"{os.path.basename(path)}: max|numpy-llama.cpp| = {worst:.3g} (rel {worst_rel:.2g}), "
          f"greedy mismatches {bad_greedy}, distinct generated ids {len(distinct)}, "
          f"top1-top2 margin: min {m.min():.3g}, <1e-3 in {int((m < 1e-3).sum())}/{n_rows} rows, "
          f"logit range [{min(min(r) for c in ref['cases'] for r in c['prompt_logits']):.3g}, "
          f"{max(max(r) for c in ref['cases'] for r in c['prompt_logits']):.3g}]")
    for e, v in eff.items():
        print(f"    effect of switching off {e:14s}: max|dlogit| = {v:.3g}")
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--effects", action="store_true")
    ap.add_argument("json", nargs="+")
    args = ap.parse_args()
    for p in args.json:
        check(p, args.effects)


if __name__ == "__main__":
    main()
