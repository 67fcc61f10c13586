#!/usr/bin/env python3
"""DeepSpeed's side of bench_ds_train.py: one rank of a ZeRO training run of a Hugging Face
Llama folder on a pre-tokenized file, on exactly the samples `zinf train` takes, in its order.

Run by the driver (directly for one rank, under torchrun for several), with DS_ACCELERATOR=cpu:

    ds_train_worker.py --model DIR --config ds_config.json --data tokens.u16 \\
        --seq-len L --steps N [--seed S] [--load DIR] [--save DIR]

Each rank loads the folder with LlamaForCausalLM.from_pretrained (fp32), hands it to
deepspeed.initialize with the config, and for each step runs gradient_accumulation_steps
micro-batches of train_micro_batch_size_per_gpu samples: forward, the mean token
cross-entropy of the logits against the targets (the inputs shifted by one token, as zinf
cuts them: the labels are not shifted again inside the model), engine.backward, engine.step.
Rank 0 prints one line per step, `ds-step N loss X seconds T grad_norm G` (G: DeepSpeed's
global gradient norm before clipping), the loss being the mean over
the step's micro-batches averaged across ranks (what zinf reports), X in full precision.

The sample order is zinf's SampleLoader (engine/data/sample_loader.cc), re-done here: the
file holds size // (L + 1) samples of L + 1 consecutive tokens; epoch e's order is a
Fisher-Yates shuffle of all of them driven by SplitMix64 seeded with seed + e, cut to a
multiple of the world size; each micro-batch row of rank r is the entry at cursor + r, the
cursor then moving on by the world size.

--load DIR resumes from a checkpoint in DIR (DeepSpeed's engine.load_checkpoint, of its
`latest`; zinf's checkpoints too): the sampler skips the global_steps steps it holds, and the
run trains steps global_steps + 1 .. N.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MASK64 = (1 << 64) - 1


class SplitMix64:
    """engine/data/internal.h's generator, in Python integers masked to 64 bits."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, bound):
        threshold = ((1 << 64) - bound) % bound  # 2^64 mod bound: the biased top range
        while True:
            r = self.next()
            if r >= threshold:
                return r % bound


class ZinfSampler:
    """The samples rank `rank` of `world` takes from a token array, in zinf's order."""

    def __init__(self, tokens, seq_len, seed, rank, world):
        self.tokens = tokens
        self.seq_len = seq_len
        self.seed = seed
        self.rank = rank
        self.world = world
        self.source_samples = len(tokens) // (seq_len + 1)
        self.samples = self.source_samples - self.source_samples % world
        if self.samples == 0:
            sys.exit(f"ds_train_worker: the data holds {self.source_samples} samples, fewer than {world} ranks")
        self.epoch = 0
        self.cursor = 0
        self.order = self._order()

    def _order(self):
        order = list(range(self.source_samples))
        random = SplitMix64(self.seed + self.epoch)
        for i in range(len(order) - 1, 0, -1):
            j = random.below(i + 1)
            order[i], order[j] = order[j], order[i]
        return order[: self.samples]

    def next(self, micro_batch):
        """(inputs, targets), each micro_batch x seq_len int64."""
        rows = []
        for _ in range(micro_batch):
            index = self.order[self.cursor + self.rank]
            start = index * (self.seq_len + 1)
            rows.append(np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64))
            self.cursor += self.world
            if self.cursor == self.samples:
                self.cursor = 0
                self.epoch += 1
                self.order = self._order()
        batch = torch.from_numpy(np.stack(rows))
        return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--data", required=True, help="*.u16 or *.u32: little-endian token ids")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1234, help="zinf train's --seed (the data order)")
    ap.add_argument("--load", default="", help="engine.load_checkpoint from here (its latest) first")
    ap.add_argument("--save", default="", help="engine.save_checkpoint here after the last step")
    args = ap.parse_args()

    import deepspeed
    import torch.distributed as dist
    from transformers import LlamaForCausalLM

    with open(args.config) as f:
        config = json.load(f)
    micro = int(config["train_micro_batch_size_per_gpu"])
    accumulation = int(config.get("gradient_accumulation_steps", 1))

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = {"u16": np.uint16, "u32": np.uint32}[args.data.rsplit(".", 1)[-1]]
    tokens = np.memmap(args.data, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")
    sampler = ZinfSampler(tokens, args.seq_len, args.seed, rank, world)

    model = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    vocab = model.config.vocab_size
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.train()
    if rank == 0:
        print(f"ds-start optimizer {type(engine.optimizer).__name__} "
              f"basic {type(getattr(engine, 'basic_optimizer', None)).__name__} "
              f"threads {torch.get_num_threads()} world {world}", flush=True)

    first = 1
    if args.load:
        path, _ = engine.load_checkpoint(args.load)
        if path is None:
            raise SystemExit(f"ds_train_worker: no checkpoint loaded from {args.load}")
        first = engine.global_steps + 1
        for _ in range((first - 1) * accumulation):
            sampler.next(micro)  # the samples of the steps the checkpoint holds
        if rank == 0:
            print(f"ds-loaded {path} global_steps {engine.global_steps}", flush=True)

    for step in range(first, args.steps + 1):
        start = time.perf_counter()
        loss_sum = 0.0
        for _ in range(accumulation):
            inputs, targets = sampler.next(micro)
            logits = engine(input_ids=inputs, use_cache=False).logits
            loss = F.cross_entropy(logits.reshape(-1, vocab).float(), targets.reshape(-1))
            engine.backward(loss)
            engine.step()
            loss_sum += loss.item()
        mean = torch.tensor([loss_sum / accumulation], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(mean)
            mean /= world
        if rank == 0:
            norm = engine.get_global_grad_norm()  # before clipping
            print(f"ds-step {step} loss {mean.item()!r} seconds {time.perf_counter() - start:.6f} "
                  f"grad_norm {float(norm) if norm is not None else float('nan'):.6g}", flush=True)

    if args.save:
        engine.save_checkpoint(args.save, tag=f"global_step{args.steps}")
        if rank == 0:
            print(f"ds-saved {args.save}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
