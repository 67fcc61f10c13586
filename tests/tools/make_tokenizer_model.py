#!/usr/bin/env python3
"""A model folder with a tokenizer of its own, as a user brings one to `zinf train --init-from`.

Run with the project's virtual environment (.venv/bin/python):

  make_tokenizer_model.py OUT TEXT...

Trains a byte-level BPE tokenizer (the `tokenizers` library; vocabulary 320 with
<|endoftext|> as EOS) on the TEXT files, saves it with transformers' save_pretrained
(tokenizer.json, tokenizer_config.json), and writes beside it a tiny random Llama whose
vocab_size is the tokenizer's (grouped-query attention, tied embeddings: the SmolLM layout),
with transformers' save_pretrained. Prints the tokenizer's vocabulary size.
"""

import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: make_tokenizer_model.py OUT TEXT...")
    out, texts = sys.argv[1], sys.argv[2:]
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train(texts, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                  bos_token="<|endoftext|>", unk_token="<unk>")
    tok.save_pretrained(out)
    torch.manual_seed(7)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    LlamaForCausalLM(config).save_pretrained(out)
    print(len(tok))


if __name__ == "__main__":
    main()
