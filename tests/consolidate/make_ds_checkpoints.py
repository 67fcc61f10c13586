#!/usr/bin/python3
"""Writes DeepSpeed-layout ZeRO checkpoints (../shared/reference/checkpoint-format.md) and the
tensors their consolidation must give, for tests/consolidate and bench/zero_to_fp32.

Needs only torch (Debian's python3-torch, 1.13): DeepSpeed's own objects that appear in its
pickles (the loss scaler, the ZeroStageEnum) are stand-in classes registered under DeepSpeed's
module names, so the pickles name `deepspeed.` globals exactly as DeepSpeed's files do.

  make_ds_checkpoints.py OUT_DIR [--only NAME]...   the fixtures listed in FIXTURES
  make_ds_checkpoints.py OUT_DIR --big GB [--world-size N] [--tensor-mb MB]
                                                    one stage-3 checkpoint of about GB gigabytes
                                                    of fp32 partitions (for the benchmark)

Each fixture NAME gets OUT_DIR/NAME/ckpt (the checkpoint: `latest` and the tag folder) and
OUT_DIR/NAME/expected_{fp32,bf16,fp16}.safetensors: every tensor of the consolidated state dict
in output order (buffers, frozen params, trainable params, aliases) converted to that dtype by
torch, with __metadata__ {"frozen": JSON list of frozen names, "aliases": JSON object alias ->
target, "stage": "N", "tag": the tag}. Values are seeded, so runs are reproducible.
"""

import argparse
import collections
import enum
import json
import math
import os
import struct
import sys
import types

import torch

# ---- DeepSpeed stand-ins: classes whose pickles name DeepSpeed's modules ----


def _fake_module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            sys.modules[sub] = types.ModuleType(sub)
    return sys.modules[name]


def _register(cls, module, name):
    cls.__module__ = module
    cls.__qualname__ = name
    cls.__name__ = name
    setattr(_fake_module(module), name, cls)
    return cls


class _DynamicLossScaler:
    def __init__(self, scale):
        self.cur_scale = scale
        self.cur_iter = 7
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.scale_window = 1000
        self.min_scale = 1
        self.delayed_shift = 1
        self.cur_hysteresis = 1
        self.consecutive_hysteresis = False
        self.raise_error_at_min_scale = True
        self.dynamic = True
        self.dtype = torch.float16


class _LossScaler:
    def __init__(self):
        self.cur_scale = 1.0
        self.dynamic = False


DynamicLossScaler = _register(_DynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler",
                              "DynamicLossScaler")
LossScaler = _register(_LossScaler, "deepspeed.runtime.fp16.loss_scaler", "LossScaler")


class _ZeroStageEnum(int, enum.Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


# Members pickle as a call of the class with the value: deepspeed.runtime.zero.config.
# ZeroStageEnum(2).
ZeroStageEnum = _register(_ZeroStageEnum, "deepspeed.runtime.zero.config", "ZeroStageEnum")


# ---- The model a fixture saves ----

Param = collections.namedtuple("Param", "name shape frozen group")


class Spec:
    def __init__(self, name, stage, world_size, dtype, frozen=False, tied=False, groups=1,
                 sub_groups=1, seed=0):
        self.name = name
        self.stage = stage
        self.world_size = world_size
        self.dtype = dtype  # "fp16", "bf16" or "fp32": the 16-bit module weights' dtype
        self.frozen = frozen
        self.tied = tied
        self.groups = groups
        self.sub_groups = sub_groups
        self.seed = seed


FIXTURES = [
    Spec("s0_ws1_fp32", 0, 1, "fp32", tied=True, seed=1),
    Spec("s1_ws1_fp16", 1, 1, "fp16", seed=2),
    Spec("s1_ws2_fp16_frozen", 1, 2, "fp16", frozen=True, groups=2, seed=3),
    Spec("s1_ws3_bf16", 1, 3, "bf16", frozen=True, tied=True, groups=2, seed=4),
    Spec("s2_ws1_fp16", 2, 1, "fp16", tied=True, seed=5),
    Spec("s2_ws2_fp16_frozen_tied", 2, 2, "fp16", frozen=True, tied=True, groups=2, seed=6),
    Spec("s2_ws3_bf16_frozen", 2, 3, "bf16", frozen=True, groups=3, seed=7),
    Spec("s3_ws1_fp16", 3, 1, "fp16", seed=8),
    Spec("s3_ws2_fp16_frozen_tied", 3, 2, "fp16", frozen=True, tied=True, sub_groups=3, seed=9),
    Spec("s3_ws3_bf16_frozen_tied", 3, 3, "bf16", frozen=True, tied=True, sub_groups=2, seed=10),
]

TORCH_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def model_params(spec):
    """Params in flattening order; numels deliberately not multiples of the world size."""
    shapes = [("embed.weight", (11, 7)), ("layers.0.attn.weight", (7, 7)),
              ("layers.0.attn.bias", (7,)), ("layers.0.mlp.weight", (13, 7)),
              ("layers.0.mlp.bias", (13,)), ("layers.1.attn.weight", (7, 7)),
              ("layers.1.norm.weight", (1,)), ("layers.1.mlp.weight", (5, 13)),
              ("final.scale", ()), ("head.bias", (11,))]
    frozen = {"layers.0.attn.bias", "layers.1.attn.weight"} if spec.frozen else set()
    params = []
    trainable = 0
    for name, shape in shapes:
        is_frozen = name in frozen
        group = 0 if is_frozen else trainable * spec.groups // (len(shapes) - len(frozen))
        if not is_frozen:
            trainable += 1
        params.append(Param(name, shape, is_frozen, group))
    return params


def numel(shape):
    return math.prod(shape)


# ---- Writing ----


def write_safetensors(path, tensors, metadata):
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, tensor in tensors.items():
        raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for blob in blobs:
            out.write(blob)


def common_model_keys(spec, ws):
    return {
        "optimizer": None,
        "lr_scheduler": {"last_epoch": 3, "_step_count": 4},
        "data_sampler": None,
        "random_ltd": None,
        "sparse_tensor_module_names": set(),
        "skipped_steps": 0,
        "global_steps": 4,
        "global_samples": 64,
        "dp_world_size": ws,
        "mp_world_size": 1,
        "ds_config": {"train_batch_size": 16, "zero_optimization": {"stage": spec.stage},
                      spec.dtype: {"enabled": spec.dtype != "fp32"}},
        "ds_version": "0.14.0",
        "client_key": [1, 2.5, "three"],
    }


def partition_flat(flat, ws):
    """Stage 1/2: pad to a multiple of 2*ws, split in ws equal partitions."""
    align = 2 * ws
    padded_len = align * math.ceil(flat.numel() / align)
    padded = torch.zeros(padded_len, dtype=torch.float32)
    padded[: flat.numel()] = flat
    size = padded_len // ws
    return [padded[r * size:(r + 1) * size].clone() for r in range(ws)], padded_len - flat.numel()


def save_checkpoint(spec, ckpt_dir, master, buffers, params, alias, tag):
    ws = spec.world_size
    os.makedirs(os.path.join(ckpt_dir, tag), exist_ok=True)
    half = TORCH_DTYPE[spec.dtype]
    shared = {alias[0]: alias[1]} if alias else {}
    prefix = "bf16_" if spec.dtype == "bf16" else ""
    scaler = DynamicLossScaler(65536.0) if spec.dtype == "fp16" else LossScaler()
    trainable = [p for p in params if not p.frozen]
    frozen = [p for p in params if p.frozen]
    path = lambda name: os.path.join(ckpt_dir, tag, name)

    if spec.stage in (0, 1, 2):
        module = collections.OrderedDict()
        for p in params:
            module[p.name] = master[p.name].to(half)
        if alias:
            module[alias[0]] = module[alias[1]]  # tied: one storage, two names
        for name, b in buffers.items():
            module[name] = b.to(half) if b.is_floating_point() else b
        state = {"module": module, "buffer_names": list(buffers)}
        if spec.stage == 0:
            state["param_shapes"] = None
            state["frozen_param_shapes"] = None
            state["frozen_param_fragments"] = None
        else:
            state["param_shapes"] = [
                collections.OrderedDict((p.name, torch.Size(p.shape)) for p in trainable
                                        if p.group == g) for g in range(spec.groups)]
            if spec.stage == 2 and frozen:
                state["frozen_param_shapes"] = collections.OrderedDict(
                    (p.name, torch.Size(p.shape)) for p in frozen)
                state["frozen_param_fragments"] = {p.name: module[p.name] for p in frozen}
            else:
                state["frozen_param_shapes"] = None
                state["frozen_param_fragments"] = None
        state["shared_params"] = shared
        state.update(common_model_keys(spec, ws))
        torch.save(state, path("mp_rank_00_model_states.pt"))
        if spec.stage == 0:
            return
        groups = []
        for g in range(spec.groups):
            flat = torch.cat([master[p.name].reshape(-1) for p in trainable if p.group == g])
            groups.append(partition_flat(flat, ws))
        bf16_zero1 = spec.dtype == "bf16" and spec.stage == 1
        for r in range(ws):
            parts = []
            paddings = []
            for partitions, padding in groups:
                part = partitions[r]
                pad = padding if r == ws - 1 else 0
                # Stage 1/2 slice the padding off (the storage stays whole); the bf16 ZeRO-1
                # optimizer keeps it.
                parts.append(part if bf16_zero1 else part.narrow(0, 0, part.numel() - pad))
                paddings.append(pad)
            inner = {
                "loss_scaler": scaler,
                "dynamic_loss_scale": spec.dtype == "fp16",
                "overflow": False,
                "clip_grad": 1.0,
                "base_optimizer_state": {"state": {}, "param_groups": [{"lr": 1e-3}]},
                "single_partition_of_fp32_groups": parts,
                "group_paddings": paddings,
                "partition_count": [ws] * spec.groups,
                "param_slice_mappings": [collections.OrderedDict() for _ in parts],
            }
            if bf16_zero1:
                del inner["loss_scaler"], inner["dynamic_loss_scale"], inner["overflow"]
                inner["ds_version"] = "0.14.0"
            else:
                inner["zero_stage"] = ZeroStageEnum(spec.stage)
            torch.save({"optimizer_state_dict": inner, "ds_config": {"zero": spec.stage},
                        "ds_version": "0.14.0"},
                       path(f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
        return

    # Stage 3: every param split in ws slices of ceil(numel / ws), the last padded.
    def fragments(tensor):
        n = tensor.numel()
        p = math.ceil(n / ws)
        padded = torch.zeros(p * ws, dtype=tensor.dtype)
        padded[:n] = tensor.reshape(-1)
        return [padded[r * p:(r + 1) * p].clone() for r in range(ws)]

    # param_shapes per sub-group (split at param boundaries)...
    per_sub = math.ceil(len(trainable) / spec.sub_groups)
    shape_groups = [trainable[i:i + per_sub] for i in range(0, len(trainable), per_sub)]
    for r in range(ws):
        module = collections.OrderedDict()
        for p in params:
            module[p.name] = torch.empty(0, dtype=half)
        for name, b in buffers.items():
            module[name] = b.to(half) if b.is_floating_point() else b
        state = {
            "module": module,
            "buffer_names": list(buffers),
            "param_shapes": [collections.OrderedDict((p.name, torch.Size(p.shape)) for p in g)
                             for g in shape_groups],
            "frozen_param_shapes": collections.OrderedDict(
                (p.name, torch.Size(p.shape)) for p in frozen) if frozen else None,
            "frozen_param_fragments": {p.name: fragments(master[p.name].to(half))[r]
                                       for p in frozen} if frozen else None,
            "shared_params": shared if r == 0 else {},
        }
        state.update(common_model_keys(spec, ws))
        torch.save(state, path(f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"))
        flat = torch.cat([fragments(master[p.name])[r] for p in trainable])
        # ...and the flat fp32 groups split at other points, so a slice crosses a boundary.
        cuts = sorted({flat.numel() * k // spec.sub_groups + (k % 2) for k in
                       range(1, spec.sub_groups)})
        bounds = [0] + cuts + [flat.numel()]
        flat_groups = [flat[bounds[i]:bounds[i + 1]].clone() for i in range(len(bounds) - 1)]
        inner = {
            "zero_stage": ZeroStageEnum.weights,
            "loss_scaler": scaler,
            "dynamic_loss_scale": spec.dtype == "fp16",
            "overflow": False,
            "partition_count": ws,
            "optimizer_state_dict": {"state": {}, "param_groups": [{"lr": 1e-3}]},
            "fp32_flat_groups": flat_groups,
        }
        torch.save({"optimizer_state_dict": inner, "ds_config": {"zero": 3},
                    "ds_version": "0.14.0"},
                   path(f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))


def make_fixture(spec, out_dir):
    gen = torch.Generator().manual_seed(spec.seed)
    params = model_params(spec)
    half = TORCH_DTYPE[spec.dtype]
    master = {}
    for p in params:
        value = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        # Frozen params exist only in 16-bit; stage 0 keeps the module's dtype.
        master[p.name] = value.to(half).float() if p.frozen or spec.stage == 0 else value
    buffers = collections.OrderedDict()
    buffers["layers.0.norm.running_mean"] = torch.randn((7,), generator=gen).to(half).float()
    buffers["layers.0.norm.num_batches"] = torch.tensor([5, -3, 1 << 20], dtype=torch.int64)
    alias = ("lm_head.weight", "embed.weight") if spec.tied else None
    tag = f"global_step{spec.seed * 10}"
    ckpt_dir = os.path.join(out_dir, spec.name, "ckpt")
    save_checkpoint(spec, ckpt_dir, master, buffers, params, alias, tag)
    with open(os.path.join(ckpt_dir, "latest"), "w") as out:
        out.write(tag + ("\n" if spec.seed % 2 else ""))

    expected = collections.OrderedDict()
    for name, b in buffers.items():
        expected[name] = b.float()
    for p in params:
        if p.frozen:
            expected[p.name] = master[p.name]
    for p in params:
        if not p.frozen:
            expected[p.name] = master[p.name]
    if alias:
        expected[alias[0]] = expected[alias[1]]
    metadata = {"frozen": json.dumps([p.name for p in params if p.frozen]),
                "aliases": json.dumps(dict([alias]) if alias else {}),
                "stage": str(spec.stage), "tag": tag}
    for suffix, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16),
                          ("fp16", torch.float16)):
        write_safetensors(os.path.join(out_dir, spec.name, f"expected_{suffix}.safetensors"),
                          collections.OrderedDict((k, v.to(dtype)) for k, v in expected.items()),
                          metadata)


def load_file(path):
    return torch.load(path, weights_only=False)


# Malformed checkpoints, each a copy of a good fixture with one thing wrong (every error must
# name the file it found wrong): NAME -> (source fixture, file in the tag folder, change).
def _shorter_last_flat_group(state):
    groups = state["optimizer_state_dict"]["fp32_flat_groups"]
    groups[-1] = groups[-1][:-1].clone()


def _bigger_first_param(state):
    group = state["param_shapes"][0]
    name = next(iter(group))
    group[name] = torch.Size([group[name].numel() + 40])


def _huge_shape(state):
    group = state["param_shapes"][-1]
    group[next(iter(group))] = torch.Size([1 << 32, 1 << 32])


def _partition_count_three(state):
    state["optimizer_state_dict"]["partition_count"] = [3, 3]


BROKEN = {
    "broken_s3_rank_sizes": ("s3_ws2_fp16_frozen_tied", "zero_pp_rank_1_mp_rank_00_optim_states.pt",
                             _shorter_last_flat_group),
    "broken_s2_param_shapes": ("s2_ws2_fp16_frozen_tied", "mp_rank_00_model_states.pt",
                               _bigger_first_param),
    "broken_s3_huge_shape": ("s3_ws1_fp16", "zero_pp_rank_0_mp_rank_00_model_states.pt",
                             _huge_shape),
    "broken_s1_partition_count": ("s1_ws2_fp16_frozen", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                  _partition_count_three),
}


def make_broken(name, out_dir):
    import shutil
    source, file_name, change = BROKEN[name]
    source_dir = os.path.join(out_dir, source, "ckpt")
    if not os.path.isdir(source_dir):
        make_fixture(next(s for s in FIXTURES if s.name == source), out_dir)
    target = os.path.join(out_dir, name, "ckpt")
    shutil.copytree(source_dir, target)
    with open(os.path.join(target, "latest")) as f:
        tag = f.read().strip()
    path = os.path.join(target, tag, file_name)
    state = load_file(path)
    change(state)
    torch.save(state, path)


def make_big(out_dir, gigabytes, ws, tensor_mb):
    """A stage-3 checkpoint of about `gigabytes` of fp32 partitions (all ranks together), made
    one rank at a time so this script holds about one rank's partitions."""
    per_param = tensor_mb * 1024 * 1024 // 4 + 3  # odd numels: padding in every param
    count = max(1, int(gigabytes * 1e9 // (per_param * 4)))
    shapes = [(f"layers.{i}.weight", (per_param,)) for i in range(count)]
    tag = "global_step1"
    os.makedirs(os.path.join(out_dir, tag), exist_ok=True)
    spec = Spec("big", 3, ws, "bf16")
    p_of = [math.ceil(per_param / ws) for _ in shapes]
    for r in range(ws):
        module = collections.OrderedDict((name, torch.empty(0, dtype=torch.bfloat16))
                                         for name, _ in shapes)
        module["norm.running_mean"] = torch.zeros(16, dtype=torch.bfloat16)
        state = {"module": module, "buffer_names": ["norm.running_mean"],
                 "param_shapes": [collections.OrderedDict((n, torch.Size(s)) for n, s in shapes)],
                 "frozen_param_shapes": None, "frozen_param_fragments": None,
                 "shared_params": {}}
        state.update(common_model_keys(spec, ws))
        torch.save(state, os.path.join(out_dir, tag,
                                       f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"))
        gen = torch.Generator().manual_seed(1000 + r)
        flat = torch.randn(sum(p_of), generator=gen, dtype=torch.float32)
        half = flat.numel() // 2
        inner = {"zero_stage": ZeroStageEnum.weights, "loss_scaler": LossScaler(),
                 "dynamic_loss_scale": False, "overflow": False, "partition_count": ws,
                 "optimizer_state_dict": {"state": {}, "param_groups": []},
                 "fp32_flat_groups": [flat[:half], flat[half:]]}
        torch.save({"optimizer_state_dict": inner, "ds_config": {}, "ds_version": "0.14.0"},
                   os.path.join(out_dir, tag, f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
        del flat, inner
    with open(os.path.join(out_dir, "latest"), "w") as out:
        out.write(tag)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--big", type=float)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--tensor-mb", type=int, default=64)
    args = parser.parse_args()
    if args.big:
        make_big(args.out_dir, args.big, args.world_size, args.tensor_mb)
        return
    for spec in FIXTURES:
        if not args.only or spec.name in args.only:
            make_fixture(spec, args.out_dir)
    for name in BROKEN:
        if not args.only or name in args.only:
            make_broken(name, args.out_dir)


if __name__ == "__main__":
    main()
