#!/usr/bin/python3
"""Writes a tiny Hugging Face Llama folder and the logits a Hugging Face Llama computes.

Run with Debian's /usr/bin/python3 (python3-torch 1.13); no transformers, no safetensors
package: the safetensors files are written by hand (8-byte little-endian header length, JSON
header, data), and the forward pass below follows transformers' LlamaForCausalLM (RMSNorm in
fp32, rotary positions with rotate_half on the two halves of each head, causal softmax
attention, SwiGLU MLP, optional tied head).

  make_hf_llama.py OUT [--dtype float32|bfloat16|float16] [--shards N] [--tied] [--seed S]
                       [--pattern TEXT --seq-len L]
                       [--hidden H --intermediate I --layers N --heads A --vocab V]
                       [--kv-heads K] [--head-dim D]

The shape defaults to hidden 32, intermediate 88, 2 layers, 4 heads, vocab 256; --kv-heads
(grouped-query attention: each key/value head serves heads / K query heads, repeated as
transformers' repeat_kv does) defaults to the heads, --head-dim to hidden / heads (given, it
is written to config.json's "head_dim").
OUT receives config.json, model.safetensors (--shards 0) or model-0000k-of-0000N.safetensors
with model.safetensors.index.json, and expected.safetensors: "tokens" (I64 [2, 12]) and
"logits" (F32 [2, 12, vocab]) computed from the weights as stored (rounded to --dtype, then
fp32); with --pattern, "pattern_loss" (F32 [1]): the mean cross-entropy of one sample of
L + 1 bytes repeating TEXT (the sample `zinf train` cuts from a file of that text repeated).
"""

import argparse
import json
import math
import os
import struct

import torch

DTYPES = {"float32": (torch.float32, "F32"), "bfloat16": (torch.bfloat16, "BF16"),
          "float16": (torch.float16, "F16")}


def config(args):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads or args.heads,
        "vocab_size": args.vocab,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 50000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": args.tied,
        "torch_dtype": args.dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **({"head_dim": args.head_dim} if args.head_dim else {}),
    }


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def make_weights(c, seed):
    g = torch.Generator().manual_seed(seed)
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q_out = c["num_attention_heads"] * head_dim(c)
    kv_out = c["num_key_value_heads"] * head_dim(c)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.2

    def norm():
        return 1.0 + 0.1 * torch.randn(h, generator=g)

    w = {"model.embed_tokens.weight": rand(v, h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm()
        shapes = {"q_proj": (q_out, h), "k_proj": (kv_out, h), "v_proj": (kv_out, h),
                  "o_proj": (h, q_out)}
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            w[p + f"self_attn.{proj}.weight"] = rand(*shapes[proj])
        w[p + "post_attention_layernorm.weight"] = norm()
        w[p + "mlp.gate_proj.weight"] = rand(inter, h)
        w[p + "mlp.up_proj.weight"] = rand(inter, h)
        w[p + "mlp.down_proj.weight"] = rand(h, inter)
    w["model.norm.weight"] = norm()
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = rand(v, h)
    return w


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors):
    """tensors: list of (name, tensor, safetensors dtype name)."""
    header, offset, blobs = {}, 0, []
    for name, t, dtype in tensors:
        data = tensor_bytes(t)
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    return offset


# ---- transformers' Llama forward, in plain torch -------------------------------------------

def rms_norm(x, w, eps):
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def forward(c, w, tokens):
    b, s = tokens.shape
    h, heads, kv_heads = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = head_dim(c)
    eps = c["rms_norm_eps"]
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(s).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((s, s), float("-inf")).triu(1)
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        y = rms_norm(x, w[p + "input_layernorm.weight"], eps)

        def heads_of(name, n):
            return (y @ w[p + f"self_attn.{name}.weight"].T).view(b, s, n, d).transpose(1, 2)

        q = heads_of("q_proj", heads)
        k, v = heads_of("k_proj", kv_heads), heads_of("v_proj", kv_heads)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # repeat_kv: key/value head j serves query heads j * g .. (j + 1) * g - 1.
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        scores = q @ k.transpose(2, 3) / math.sqrt(d) + mask
        attn = torch.softmax(scores.float(), dim=-1) @ v
        x = x + attn.transpose(1, 2).reshape(b, s, heads * d) @ w[p + "self_attn.o_proj.weight"].T
        y = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(y @ w[p + "mlp.gate_proj.weight"].T)
        x = x + (gate * (y @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    return (x @ head.T).float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--shards", type=int, default=0)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--pattern", default="")
    ap.add_argument("--seq-len", type=int, default=16)
    # The shape (the tests use the defaults; larger ones are for measurements).
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--intermediate", type=int, default=88)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--head-dim", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    c = config(args)
    torch_dtype, st_dtype = DTYPES[args.dtype]
    # The weights as stored, and the fp32 values a reader gets back from them.
    stored = {n: t.to(torch_dtype) for n, t in make_weights(c, args.seed).items()}
    w = {n: t.float() for n, t in stored.items()}

    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    items = [(n, t, st_dtype) for n, t in stored.items()]
    if args.shards <= 0:
        write_safetensors(os.path.join(args.out, "model.safetensors"), items)
    else:
        n = args.shards
        per = -(-len(items) // n)
        weight_map, total = {}, 0
        for k in range(n):
            name = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
            part = items[k * per:(k + 1) * per]
            total += write_safetensors(os.path.join(args.out, name), part)
            weight_map.update({t[0]: name for t in part})
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

    g = torch.Generator().manual_seed(args.seed + 100)
    tokens = torch.randint(0, c["vocab_size"], (2, 12), generator=g)
    expected = [("tokens", tokens, "I64"), ("logits", forward(c, w, tokens), "F32")]
    if args.pattern:
        text = args.pattern.encode()
        sample = torch.tensor([[text[i % len(text)] for i in range(args.seq_len + 1)]])
        logits = forward(c, w, sample[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c["vocab_size"]),
                                                 sample[:, 1:].reshape(-1))
        expected.append(("pattern_loss", loss.reshape(1), "F32"))
    write_safetensors(os.path.join(args.out, "expected.safetensors"), expected)


if __name__ == "__main__":
    main()
