"""A tiny Llama of the installed transformers trains 5 steps on a rank's simulated GPU, as a GPU
program writes it (run by tests/test_gpu_api.py once per transformers release). Prints one JSON object.

    SIMCLUSTER_INSTRUMENT=1 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 PYTHONPATH=launcher/instrument/boot:. python tests/transformers_check.py
"""
import json
import os

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import is_flash_attn_2_available

torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=32)
device = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(device)
model = LlamaForCausalLM(config).to(device)  # model.to(local_rank), as PyTorch's DDP tutorial writes it
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
ids = torch.randint(0, 64, (4, 16), device="cuda")
losses = []
for _ in range(5):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(round(loss.item(), 4))
print(json.dumps({"version": transformers.__version__, "flash_attn_2": is_flash_attn_2_available(),
                  "attn": model.config._attn_implementation, "losses": losses}))
