#!/usr/bin/env python3
"""A SmolLM-135M-shaped model folder with a tokenizer of its own, for `zinf train --init-from`.

Run with the project's virtual environment (.venv/bin/python):

  make_smollm_shaped.py OUT TEXT...

The shape is SmolLM-135M's (hidden 576, intermediate 1536, 30 layers, 9 heads with 3
key/value heads, vocabulary 49152, tied embeddings, rope_theta 10000, 2048 positions), the
weights transformers' random initialisation (seeded), written by save_pretrained. The
tokenizer is a byte-level BPE trained on the TEXT files with the `tokenizers` library (up to
49152 ids; <|endoftext|> is EOS), saved beside the weights. No download: SmolLM's own weights
and tokenizer are not needed to measure the runtime on its shape.
"""

import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: make_smollm_shaped.py OUT TEXT...")
    out, texts = sys.argv[1], sys.argv[2:]
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train(texts, trainers.BpeTrainer(vocab_size=49152,
                                         special_tokens=["<|endoftext|>", "<unk>"],
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                         show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                  bos_token="<|endoftext|>", unk_token="<unk>")
    tok.save_pretrained(out)
    torch.manual_seed(135)
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{out}: {params / 1e6:.1f} M parameters, tokenizer of {len(tok)} ids")


if __name__ == "__main__":
    main()
