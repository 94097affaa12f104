"""PyTorch 2.6 side of train_interop_test: loads a checkpoint written by shardpoint-train.

usage: lightning26.py SHARDED_CKPT_DIR CONSOLIDATED_FILE
1. meta.pt loads with torch.load(weights_only=True) and has Lightning's keys;
2. torch DCP loads {"model": state_dict} into a Python nn.Transformer-based model with the
   demo's module names (tiny sizes), then load_state_dict(strict=True);
3. dcp_to_torch_save consolidates the folder; every tensor equals the DCP-loaded model's and
   the file shardpoint consolidated (its "state_dict").
Prints "ok" on success.
"""
import sys
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

ckpt, consolidated = sys.argv[1], sys.argv[2]
vocab = dcp.FileSystemReader(ckpt).read_metadata().state_dict_metadata["model.model.embedding.weight"].size[0]


class Transformer(nn.Module):  # the demo's module names; tiny hyper-parameters
    def __init__(self, vocab_size, ninp=32, nhead=2, nhid=64, nlayers=2, dropout=0.2):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, ninp)
        self.transformer = nn.Transformer(d_model=ninp, nhead=nhead, num_encoder_layers=nlayers,
                                          num_decoder_layers=nlayers, dim_feedforward=nhid,
                                          dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(ninp, vocab_size)


class LightningTransformer(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.model = Transformer(vocab_size)


meta = torch.load(f"{ckpt}/meta.pt", weights_only=True)
for key in ("epoch", "global_step", "pytorch-lightning_version", "loops", "callbacks", "lr_schedulers"):
    assert key in meta, key
assert "state_dict" not in meta and "optimizer_states" not in meta
assert len(meta["callbacks"]) == 1

module = LightningTransformer(vocab)
state = {"model": module.state_dict()}
dcp.load(state, checkpoint_id=ckpt)
module.load_state_dict(state["model"], strict=True)
assert len(state["model"]) == 67

dcp_to_torch_save(ckpt, f"{ckpt}.torch26.pt")
mine = torch.load(f"{ckpt}.torch26.pt", weights_only=True)["model"]
ours = torch.load(consolidated, weights_only=True)
ours = ours.get("state_dict", ours.get("model", ours))
for name, value in module.state_dict().items():
    assert torch.equal(mine[name], value), name
    assert torch.equal(ours[name], value), name
print("ok")
