"""PyTorch 2.6 side of train_interop_test: loads a checkpoint written by shardpoint-train.

usage: lightning26.py SHARDED_CKPT_DIR CONSOLIDATED_FILE [FULL_CKPT_FILE]
1. meta.pt loads with torch.load(weights_only=True) and has Lightning's keys;
2. torch DCP loads {"model": state_dict} into a Python nn.Transformer-based model with the
   demo's module names (tiny sizes), then load_state_dict(strict=True);
3. dcp_to_torch_save consolidates the folder; every tensor equals the DCP-loaded model's and
   the file shardpoint consolidated (its "state_dict").
4. (with FULL_CKPT_FILE, an Adam run saved "full") the file loads with weights_only=True,
   its optimizer state is keyed by integer parameter ids as Lightning's full checkpoints
   are, and torch.optim.Adam.load_state_dict + nn.Module.load_state_dict(strict) take it.
Prints "ok" on success.
"""
import sys
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

ckpt, consolidated = sys.argv[1], sys.argv[2]
full_file = sys.argv[3] if len(sys.argv) > 3 else None
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

if full_file:
    full = torch.load(full_file, weights_only=True)
    assert list(full)[:4] == ["epoch", "global_step", "pytorch-lightning_version", "state_dict"], list(full)
    osd = full["optimizer_states"][0]
    assert sorted(osd["state"]) == list(range(67)), list(osd["state"])[:3]
    assert osd["param_groups"][0]["params"] == list(range(67))
    model = LightningTransformer(full["state_dict"]["model.embedding.weight"].shape[0])
    model.load_state_dict(full["state_dict"], strict=True)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    adam.load_state_dict(osd)
    names = [n for n, _ in model.named_parameters()]
    for i, p in enumerate(model.parameters()):
        assert adam.state[p]["exp_avg"].shape == p.shape, names[i]
    assert float(adam.state[next(model.parameters())]["step"]) == full["global_step"]
    key = next(iter(full["callbacks"]))
    assert key.startswith("ModelCheckpoint{'monitor': 'train_loss', 'mode': 'min'"), key
print("ok")
