# Makes two tiny Llama checkpoints with Hugging Face transformers (save_pretrained) and the
# logits transformers computes for fixed tokens, as fixtures for zinf's --init-from loader.
import json, os, sys, torch, transformers
from transformers import LlamaConfig, LlamaForCausalLM
from safetensors.torch import save_file
print("torch", torch.__version__, "transformers", transformers.__version__)
out = os.environ["OUT"]
tokens = torch.tensor([[1, 7, 42, 200, 13, 99, 5, 255, 0, 64, 128, 31]], dtype=torch.long)
def make(name, tied, dtype, shard):
    torch.manual_seed(1234 if tied else 4321)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied,
                      attn_implementation="eager")
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights so a wrong norm shows
        for n, p in m.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    m = m.to(dtype)
    d = os.path.join(out, name)
    kw = {"safe_serialization": True}
    if shard:
        kw["max_shard_size"] = "150KB"
    m.save_pretrained(d, **kw)
    for f in os.listdir(d):
        if f == "generation_config.json":
            os.remove(os.path.join(d, f))
    with torch.no_grad():
        logits = m.float()(tokens).logits[0].contiguous()
    save_file({"tokens": tokens[0].contiguous(), "logits": logits}, os.path.join(d, "expected_logits.safetensors"))
    print(name, sorted(os.listdir(d)), "params", sum(p.numel() for p in m.parameters()))
    print(open(os.path.join(d, "config.json")).read())
make("llama_untied_fp32", False, torch.float32, False)
make("llama_tied_bf16_sharded", True, torch.bfloat16, True)
