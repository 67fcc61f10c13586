#!/usr/bin/env python3
"""Logits of transformers' LlamaForCausalLM for each folder given, from `from_pretrained`.

Run with the project's virtual environment (.venv/bin/python, scripts/install-venv.sh):

  transformers_logits.py OUT.safetensors FOLDER...

Each FOLDER is loaded with LlamaForCausalLM.from_pretrained in fp32 with eager attention and
run on one fixed batch of tokens (I64 [2, 12], ids below the config's vocab_size). OUT
receives "tokens" and "logits<i>" (F32 [2, 12, vocab]) for the i-th folder, in order. Any
file the folder holds that transformers cannot load fails here, with transformers' message.
"""

import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: transformers_logits.py OUT.safetensors FOLDER...")
    out, folders = sys.argv[1], sys.argv[2:]
    vocab = LlamaConfig.from_pretrained(folders[0]).vocab_size
    tokens = (torch.arange(24, dtype=torch.int64).reshape(2, 12) * 37 + 11) % vocab
    result = {"tokens": tokens}
    for i, folder in enumerate(folders):
        model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="eager")
        model.eval()
        with torch.no_grad():
            result[f"logits{i}"] = model(tokens).logits.float().contiguous()
        print(f"{folder}: loaded, logits {tuple(result[f'logits{i}'].shape)}")
    save_file(result, out)


if __name__ == "__main__":
    main()
