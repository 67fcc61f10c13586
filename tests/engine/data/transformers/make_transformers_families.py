#!/usr/bin/env python3
"""Tiny models of every family zinf's decoder computes, written by transformers itself.

Run with the project's virtual environment (.venv/bin/python, scripts/install-venv.sh):

  make_transformers_families.py OUT [NAME...]

For each case (all of them, or the NAMEs given) transformers builds the model from a config
(AutoModelForCausalLM.from_config), its parameters are drawn at random (so that biases, norm
weights and scaled rotary frequencies all show in the logits), `save_pretrained` writes
OUT/NAME in the case's dtype (one file, or shards), and OUT/NAME/expected_logits.safetensors
receives "tokens" (I64 [2, 12]) and "logits" (F32 [2, 12, vocab]): what transformers computes
after loading that folder back with from_pretrained in fp32 with eager attention.

The cases cover: model_type llama, mistral, qwen2 and qwen3; grouped- and multi-query
attention; an explicit head_dim; rotary scaling of type linear, dynamic (the 12 tokens exceed
max_position_embeddings 8, so the base grows), llama3 and yarn (derived and given attention
factors); Llama's attention_bias and mlp_bias; Qwen2's q/k/v biases; Qwen3's q/k norms;
Mistral's sliding window and Qwen's sliding layers (windows shorter than the 12 tokens); tied
embeddings; fp32 and bf16; one file and shards. tests/engine/data/transformers/families holds
the output of one run (transformers 5.24.0); transformers_interop_test runs it again with the
transformers of .venv/.
"""

import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

BASE = dict(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-6, tie_word_embeddings=False)

CASES = {
    # Llama 3.1's rotary scaling with grouped-query attention and a tied head.
    "llama_llama3_rope_tied_fp32": dict(
        model_type="llama", tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=16)),
    # Every Llama bias, linear rotary scaling, bf16 in shards.
    "llama_bias_linear_rope_bf16_sharded": dict(
        model_type="llama", attention_bias=True, mlp_bias=True, num_key_value_heads=4,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0),
        dtype=torch.bfloat16, shard="20KB"),
    # Dynamic NTK scaling: 12 tokens past max_position_embeddings 8.
    "llama_dynamic_rope_fp32": dict(
        model_type="llama", max_position_embeddings=8,
        rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
    # YaRN with the attention factor derived from the scaling factor; multi-query attention.
    "llama_yarn_rope_mqa_fp32": dict(
        model_type="llama", num_key_value_heads=1, max_position_embeddings=32,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=8)),
    # Mistral: a sliding window of 5 over 12 tokens, an explicit head_dim.
    "mistral_sliding_window_fp32": dict(
        model_type="mistral", sliding_window=5, head_dim=16,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
    # Qwen2: q/k/v biases, a tied head, the second layer sliding (max_window_layers 1); bf16
    # in shards.
    "qwen2_bias_sliding_tied_bf16_sharded": dict(
        model_type="qwen2", tie_word_embeddings=True, use_sliding_window=True, sliding_window=4,
        max_window_layers=1, dtype=torch.bfloat16, shard="20KB"),
    # Qwen3: q/k norms, head_dim 16 where hidden / heads is 8, multi-query attention.
    "qwen3_qk_norm_fp32": dict(
        model_type="qwen3", head_dim=16, num_key_value_heads=1,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
    # Qwen3 with attention biases and YaRN with a given attention factor and betas; bf16.
    "qwen3_bias_yarn_bf16": dict(
        model_type="qwen3", head_dim=8, attention_bias=True, max_position_embeddings=32,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=2.0,
                             original_max_position_embeddings=16, attention_factor=1.2,
                             beta_fast=16.0, beta_slow=2.0),
        dtype=torch.bfloat16),
}


def make(out, name, case, seed):
    case = dict(case)
    dtype = case.pop("dtype", torch.float32)
    shard = case.pop("shard", None)
    model_type = case.pop("model_type")
    config = AutoConfig.for_model(model_type, **{**BASE, **case})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    folder = os.path.join(out, name)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.to(dtype).save_pretrained(folder, **kwargs)
    gen = os.path.join(folder, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    # What a user of transformers gets from the folder: from_pretrained, fp32, eager.
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    vocab = config.vocab_size
    tokens = (torch.arange(24, dtype=torch.int64).reshape(2, 12) * 37 + 11) % vocab
    with torch.no_grad():
        logits = loaded(tokens).logits.float().contiguous()
    save_file({"tokens": tokens, "logits": logits},
              os.path.join(folder, "expected_logits.safetensors"))
    files = sorted(os.listdir(folder))
    print(f"{name}: {type(loaded).__name__}, {sum(p.numel() for p in loaded.parameters())} "
          f"parameters, {files}, largest |logit| {logits.abs().max().item():.4f}")


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: make_transformers_families.py OUT [NAME...]")
    out, names = sys.argv[1], sys.argv[2:] or list(CASES)
    hf_logging.disable_progress_bar()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for i, name in enumerate(names):
        if name not in CASES:
            sys.exit(f"unknown case {name}; the cases: {', '.join(CASES)}")
        make(out, name, CASES[name], 1000 + i)


if __name__ == "__main__":
    main()
