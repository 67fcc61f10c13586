#!/usr/bin/env python3
"""Logits of transformers' model for each folder given, from `from_pretrained`.

Run with the project's virtual environment (.venv/bin/python, scripts/install-venv.sh):

  transformers_logits.py OUT.safetensors FOLDER...

Each FOLDER is loaded with AutoModelForCausalLM.from_pretrained (the class its config.json's
model_type names: Llama, Mistral, Qwen2, Qwen3) in fp32 with eager attention and
run on one fixed batch of tokens (I64 [2, 12], ids below the config's vocab_size). OUT
receives "tokens" and "logits<i>" (F32 [2, 12, vocab]) for the i-th folder, in order. Any
file the folder holds that transformers cannot load fails here, with transformers' message.
"""

import sys

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: transformers_logits.py OUT.safetensors FOLDER...")
    out, folders = sys.argv[1], sys.argv[2:]
    vocab = AutoConfig.from_pretrained(folders[0]).vocab_size
    tokens = (torch.arange(24, dtype=torch.int64).reshape(2, 12) * 37 + 11) % vocab
    result = {"tokens": tokens}
    for i, folder in enumerate(folders):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                     attn_implementation="eager")
        model.eval()
        with torch.no_grad():
            result[f"logits{i}"] = model(tokens).logits.float().contiguous()
        print(f"{folder}: loaded as {type(model).__name__}, logits {tuple(result[f'logits{i}'].shape)}")
    save_file(result, out)


if __name__ == "__main__":
    main()
