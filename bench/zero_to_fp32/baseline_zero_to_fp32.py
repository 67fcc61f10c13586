#!/usr/bin/python3
"""The python3-torch baseline of bench_zero_to_fp32.py: the core of DeepSpeed's
zero_to_fp32.py for a stage-3 checkpoint, written from the facts in
../shared/reference/checkpoint-format.md: load every rank's model-states and optimizer files,
concatenate each rank's fp32_flat_groups, cut every param out of the ranks' slices, torch.save
the state dict (buffers first, then params, fp32), then fsync it (zinf's output is durable
when it exits; the fsync time is printed so it can be taken out).

It drops each rank's loaded file once its flat groups are concatenated (the reference tool
keeps them to the end), which lowers its peak memory; the figures it gives are therefore
kind to the baseline.

  baseline_zero_to_fp32.py CHECKPOINT_DIR OUTPUT_FILE
"""

import collections
import glob
import math
import os
import re
import sys
import time

import torch

# The DeepSpeed stand-ins (loss scaler, ZeroStageEnum) the pickles name.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "consolidate"))
import make_ds_checkpoints  # noqa: E402,F401


def rank_of(path):
    return int(re.search(r"zero_pp_rank_(\d+)_", os.path.basename(path)).group(1))


def main():
    checkpoint_dir, output = sys.argv[1], sys.argv[2]
    with open(os.path.join(checkpoint_dir, "latest")) as f:
        tag = f.read().strip()
    folder = os.path.join(checkpoint_dir, tag)
    optim_files = sorted(glob.glob(os.path.join(folder, "*_optim_states.pt")), key=rank_of)
    model_files = sorted(glob.glob(os.path.join(folder, "*_model_states.pt")), key=rank_of)
    world_size = len(optim_files)
    model = torch.load(model_files[0], map_location="cpu")
    flat_groups = []
    for path in optim_files:
        state = torch.load(path, map_location="cpu")
        flat_groups.append(torch.cat(state["optimizer_state_dict"]["fp32_flat_groups"], 0))
        del state
    state_dict = collections.OrderedDict()
    for name in model["buffer_names"]:
        state_dict[name] = model["module"][name].float()
    shapes = {k: v for group in model["param_shapes"] for k, v in group.items()}
    offset = 0
    for name, shape in shapes.items():
        numel = shape.numel()
        part = math.ceil(numel / world_size)
        state_dict[name] = torch.cat([flat_groups[r].narrow(0, offset, part)
                                      for r in range(world_size)], 0).narrow(0, 0, numel).view(shape)
        offset += part
    if offset != flat_groups[0].numel():
        raise ValueError(f"consumed {offset} of {flat_groups[0].numel()} elements per rank")
    del flat_groups
    torch.save(state_dict, output)
    # zinf's output is durable when it exits (fsync before rename); make the baseline's so too,
    # and say how long that took, so the figures can be read either way.
    start = time.monotonic()
    fd = os.open(output, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    print(f"fsync_seconds {time.monotonic() - start:.3f}")


if __name__ == "__main__":
    main()
