#!/usr/bin/env python3
"""A Hugging Face model folder with a tokenizer of its own, as a user brings one to
`zinf train --init-from`, made without any download.

Run with the project's virtual environment (.venv/bin/python, scripts/install-venv.sh):

  make-model-with-tokenizer.py OUT TEXT... [--shape tiny|smollm-135m]

Trains a byte-level BPE tokenizer on the TEXT files with the `tokenizers` library
(<|endoftext|> is EOS and BOS), saves it with transformers' save_pretrained (tokenizer.json,
tokenizer_config.json), and writes beside it a Llama with transformers' seeded random
initialisation, grouped-query attention and tied embeddings:
  tiny         hidden 32, 2 layers, 4 heads (2 key/value), a tokenizer of 320 ids and a
               vocab_size equal to it (the tests' model);
  smollm-135m  SmolLM-135M's shape: hidden 576, intermediate 1536, 30 layers, 9 heads (3
               key/value), rope_theta 10000, 2048 positions, vocab_size 49152 (the tokenizer
               learns up to that many ids from the text).
Prints the folder, the parameter count and the tokenizer's size; the last line is the
tokenizer's size alone.
"""

import argparse

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

SHAPES = {
    "tiny": dict(tokenizer_vocab=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 rms_norm_eps=1e-6, seed=7),
    "smollm-135m": dict(tokenizer_vocab=49152, vocab_size=49152, hidden_size=576,
                        intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                        num_key_value_heads=3, max_position_embeddings=2048, rope_theta=10000.0,
                        rms_norm_eps=1e-5, seed=135),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("texts", nargs="+", metavar="TEXT")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    args = ap.parse_args()
    shape = dict(SHAPES[args.shape])
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train(args.texts, trainers.BpeTrainer(vocab_size=shape.pop("tokenizer_vocab"),
                                              special_tokens=["<|endoftext|>", "<unk>"],
                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                              show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                  bos_token="<|endoftext|>", unk_token="<unk>")
    tok.save_pretrained(args.out)
    torch.manual_seed(shape.pop("seed"))
    shape.setdefault("vocab_size", len(tok))
    config = LlamaConfig(tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id, **shape)
    model = LlamaForCausalLM(config)
    model.save_pretrained(args.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.out}: {args.shape}, {params / 1e6:.1f} M parameters, tokenizer of {len(tok)} ids")
    print(len(tok))


if __name__ == "__main__":
    main()
