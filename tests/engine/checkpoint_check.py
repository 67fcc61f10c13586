"""Reads a zinf checkpoint with torch (python3-torch 1.13) and compares it with the engine's
values, which checkpoint_test.cc wrote as raw little-endian float32 files.

usage: checkpoint_check.py CHECKPOINT_TAG_DIR EXPECTED_DIR STAGE

EXPECTED_DIR holds params.f32 (the partition's fp32 master, padding included), exp_avg.f32,
exp_avg_sq.f32 (the same for the Adam moments), master.f32 (every trainable parameter's full
fp32 values, in param_shapes order) and steps.txt (global_steps).
Exits 0 when everything matches, 1 with a message otherwise.
"""
import os
import sys
import types

import torch


# The optimizer-states file holds DeepSpeed's loss scaler object, as DeepSpeed writes it
# (deepspeed.runtime.fp16.loss_scaler's LossScaler or DynamicLossScaler). Debian's python3 has
# no deepspeed: plain classes under those names let the unpickler build it, and the check below
# reads its attributes.
def _stand_in_loss_scalers():
    module = types.ModuleType("deepspeed.runtime.fp16.loss_scaler")
    for name in ("LossScaler", "DynamicLossScaler"):
        setattr(module, name, type(name, (), {"__module__": module.__name__}))
    parts = module.__name__.split(".")
    for i in range(1, len(parts)):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    sys.modules[module.__name__] = module


_stand_in_loss_scalers()


def load_f32(path):
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.float32)


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def main():
    tag_dir, expected_dir, stage = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model_name = ("zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3
                  else "mp_rank_00_model_states.pt")
    # weights_only=False: torch 1.13's restricted unpickler refuses floats (BINFLOAT) and
    # sets, which DeepSpeed's layout puts in these files (loss scale, lr, the
    # sparse_tensor_module_names set). The files are the test's own output.
    model = torch.load(os.path.join(tag_dir, model_name), map_location="cpu", weights_only=False)
    optim = torch.load(os.path.join(tag_dir, "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
                       map_location="cpu", weights_only=False)
    with open(os.path.join(expected_dir, "steps.txt")) as f:
        steps = int(f.read())
    if model["global_steps"] != steps:
        fail("global_steps %r, expected %d" % (model["global_steps"], steps))
    if "buffer_names" not in model or model["dp_world_size"] != 1:
        fail("model-states keys: %r" % sorted(model.keys()))
    if model["data_position"] != 42:
        fail("client state data_position %r" % model.get("data_position"))

    inner = optim["optimizer_state_dict"]
    if inner["zero_stage"] != stage:
        fail("zero_stage %r" % inner["zero_stage"])
    scaler = inner["loss_scaler"]
    if (type(scaler).__qualname__ != "LossScaler" or scaler.cur_scale != 1.0
            or scaler.dynamic is not False):
        fail("loss_scaler %r (%r), expected a static LossScaler of scale 1"
             % (type(scaler), getattr(scaler, "__dict__", scaler)))
    if stage == 3:
        flat = inner["fp32_flat_groups"]
        torch_state = inner["optimizer_state_dict"]
    else:
        flat = inner["single_partition_of_fp32_groups"]
        torch_state = inner["base_optimizer_state"]
    group = torch_state["param_groups"][0]
    if abs(group["lr"] - 1.5e-3) > 1e-9 or tuple(group["betas"]) != (0.9, 0.999):
        fail("param_groups[0] %r" % group)

    # The partition, padding included at stage 3 (world size 1 has no padding below it).
    params = torch.cat([t.reshape(-1) for t in flat])
    if not torch.equal(params, load_f32(os.path.join(expected_dir, "params.f32"))):
        fail("fp32 partition differs")
    for name in ("exp_avg", "exp_avg_sq"):
        got = torch.cat([torch_state["state"][i][name].reshape(-1) for i in range(len(flat))])
        if not torch.equal(got, load_f32(os.path.join(expected_dir, name + ".f32"))):
            fail(name + " differs")
        if torch_state["state"][0]["step"] != steps:
            fail("step %r" % torch_state["state"][0]["step"])

    # DeepSpeed's consolidation (world size 1): walk param_shapes over the flat groups.
    shapes = {}
    for d in model["param_shapes"]:
        shapes.update(d)
    offset = 0
    pieces = []
    for name, shape in shapes.items():
        n = shape.numel()
        pieces.append(params[offset:offset + n])
        offset += n
    master = load_f32(os.path.join(expected_dir, "master.f32"))
    if not torch.equal(torch.cat(pieces), master):
        fail("consolidated weights differ from the engine's master weights")

    # The 16-bit (here: compute-precision fp32) weights: weights_only=True must accept them.
    bin_path = os.path.join(tag_dir, "pytorch_model.bin")
    sd = torch.load(bin_path, map_location="cpu", weights_only=True)
    got = torch.cat([sd[name].reshape(-1).float() for name in shapes])
    if not torch.equal(got, master):
        fail("pytorch_model.bin differs from the engine's weights")
    print("OK %d tensors, %d elements" % (len(sd), master.numel()))


main()
