#!/usr/bin/env python3
"""Describe each tiny family model (tests/data/families/<name>.gguf) as the
Hugging Face folder it would come from, for the HF-folder family test.

Writes tests/data/families/hf.json:
  {"families": {name: {"config": {... config.json ...},
                       "tensors": {gguf_name: hf_name, ...},
                       "norm_minus_one": bool,     # Gemma: HF stores w, GGUF 1 + w
                       "rope_rotate_half": bool}}, # llama: HF q/k rows in rotate-half order
   "llama3_rope_factors": {"config": {...}, "factors": [...]}}

The C++ test writes the folders (config.json, model.safetensors) from the GGUF
weights with this map and compares libllm's logits on them with llama.cpp's
references of the GGUF. Every HF tensor name is checked here against gguf-py's
TensorNameMap (the table llama.cpp's converter maps HF names with), so the
names are the ecosystem's, not this repository's guess.

usage: make_family_hf.py [--dir tests/data/families]
"""
import argparse
import json
import math
import os
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("needs the gguf package: pip install gguf")

# (family file, HF model_type, HF class, gguf-py arch)
FAMILIES = [
    ("llama", "llama", "LlamaForCausalLM", gguf.MODEL_ARCH.LLAMA),
    ("qwen2", "qwen2", "Qwen2ForCausalLM", gguf.MODEL_ARCH.QWEN2),
    ("qwen3", "qwen3", "Qwen3ForCausalLM", gguf.MODEL_ARCH.QWEN3),
    ("gemma2", "gemma2", "Gemma2ForCausalLM", gguf.MODEL_ARCH.GEMMA2),
    ("gemma3", "gemma3_text", "Gemma3ForCausalLM", gguf.MODEL_ARCH.GEMMA3),
    ("phi3", "phi3", "Phi3ForCausalLM", gguf.MODEL_ARCH.PHI3),
    ("qwen2_yarn", "qwen2", "Qwen2ForCausalLM", gguf.MODEL_ARCH.QWEN2),
    ("phi3_longrope", "phi3", "Phi3ForCausalLM", gguf.MODEL_ARCH.PHI3),
]

# GGUF tensor suffix -> HF module path inside model.layers.N (per family kind).
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name, gemma, phi3):
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    if gguf_name in top:
        return top[gguf_name]
    _, layer, rest = gguf_name.split(".", 2)
    module, kind = rest.rsplit(".", 1)
    if module == "ffn_up":
        path = "mlp.gate_up_proj" if phi3 else "mlp.up_proj"
    elif module == "ffn_norm":
        path = "pre_feedforward_layernorm" if gemma else "post_attention_layernorm"
    elif module == "post_attention_norm":
        path = "post_attention_layernorm"
    elif module == "post_ffw_norm":
        path = "post_feedforward_layernorm"
    else:
        path = LAYER_NAMES[module]
    return f"model.layers.{layer}.{path}.{kind}"


def field(r, key, default=None):
    f = r.fields.get(key)
    return f.contents() if f is not None else default


def describe(path, model_type, cls, arch):
    r = gguf.GGUFReader(path)
    a = field(r, "general.architecture")
    g = lambda k, d=None: field(r, f"{a}.{k}", d)
    gemma, phi3 = model_type.startswith("gemma"), model_type == "phi3"
    names = [t.name for t in r.tensors]
    tensors = {t.name: np.array(t.data) for t in r.tensors}
    n_embd, n_head = g("embedding_length"), g("attention.head_count")
    head_dim = g("attention.key_length", n_embd // n_head)
    cfg = {
        "architectures": [cls], "model_type": model_type,
        "hidden_size": n_embd, "intermediate_size": g("feed_forward_length"),
        "num_hidden_layers": g("block_count"), "num_attention_heads": n_head,
        "num_key_value_heads": g("attention.head_count_kv"), "head_dim": head_dim,
        "max_position_embeddings": g("context_length"), "rms_norm_eps": float(np.float32(g("attention.layer_norm_rms_epsilon"))),
        "rope_theta": float(g("rope.freq_base")), "vocab_size": int(tensors["token_embd.weight"].shape[0]),
        "tie_word_embeddings": "output.weight" not in names, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    if gemma:
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
        cfg["query_pre_attn_scalar"] = head_dim
        cfg["sliding_window"] = g("attention.sliding_window")
        if model_type == "gemma2":
            cfg["attn_logit_softcapping"] = float(g("attn_logit_softcapping"))
            cfg["final_logit_softcapping"] = float(g("final_logit_softcapping"))
        else:
            cfg["rope_local_base_freq"] = float(g("rope.freq_base_swa"))
            cfg["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                  for i in range(cfg["num_hidden_layers"])]
            cfg["final_logit_softcapping"] = None
    else:
        cfg["hidden_act"] = "silu"
    if model_type == "qwen2":
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = 4096
    n_rot = g("rope.dimension_count", head_dim)
    if n_rot != head_dim:
        cfg["partial_rotary_factor"] = n_rot / head_dim
    scaling = g("rope.scaling.type")
    if scaling == "yarn":
        cfg["rope_scaling"] = {"type": "yarn", "factor": float(g("rope.scaling.factor")),
                               "original_max_position_embeddings": g("rope.scaling.original_context_length")}
    elif scaling == "longrope":
        cfg["original_max_position_embeddings"] = g("rope.scaling.original_context_length")
        cfg["rope_scaling"] = {"type": "longrope",
                               "long_factor": [float(x) for x in tensors["rope_factors_long.weight"]],
                               "short_factor": [float(x) for x in tensors["rope_factors_short.weight"]]}
        # HF computes the attention factor itself; the GGUF carries the same value.
        s = cfg["max_position_embeddings"] / cfg["original_max_position_embeddings"]
        want = math.sqrt(1 + math.log(s) / math.log(cfg["original_max_position_embeddings"]))
        assert abs(want - g("rope.scaling.attn_factor")) < 1e-6, "attention factor disagrees"
    elif scaling:
        sys.exit(f"{path}: scaling {scaling} not described")

    tmap = gguf.TensorNameMap(arch, cfg["num_hidden_layers"])
    out = {}
    for n in names:
        if n.startswith("rope_factors_"):
            continue  # in config.json for HF
        if n == "rope_freqs.weight":
            sys.exit(f"{path}: random rope_freqs have no HF config form")
        h = hf_name(n, gemma, phi3)
        back = tmap.get_name(h, try_suffixes=(".weight", ".bias"))
        if back != n:
            sys.exit(f"{path}: HF name {h} maps to {back}, not {n}, in gguf-py's TensorNameMap")
        out[n] = h
    return {"config": cfg, "tensors": out, "norm_minus_one": gemma, "rope_rotate_half": a == "llama"}


def llama3_factors():
    # Llama 3.1 8B's rope_scaling, and its factors from the published rule
    # (transformers' _compute_llama3_parameters), in float64.
    cfg = {"rope_theta": 500000.0, "head_dim": 128,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}
    rs = cfg["rope_scaling"]
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, cfg["head_dim"], 2) / cfg["head_dim"])
    wavelen = 2 * np.pi / inv
    old = rs["original_max_position_embeddings"]
    lo_w, hi_w = old / rs["low_freq_factor"], old / rs["high_freq_factor"]
    scaled = np.where(wavelen > lo_w, inv / rs["factor"], inv)
    smooth = (old / wavelen - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / rs["factor"] + smooth * scaled
    medium = ~(wavelen < hi_w) & ~(wavelen > lo_w)
    scaled = np.where(medium, smoothed, scaled)
    return {"config": cfg, "factors": [float(x) for x in inv / scaled]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="tests/data/families")
    args = ap.parse_args()
    out = {"generator": "tests/tools/make_family_hf.py --dir " + args.dir, "families": {}}
    for name, model_type, cls, arch in FAMILIES:
        out["families"][name] = describe(os.path.join(args.dir, name + ".gguf"), model_type, cls, arch)
    out["llama3_rope_factors"] = llama3_factors()
    path = os.path.join(args.dir, "hf.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
