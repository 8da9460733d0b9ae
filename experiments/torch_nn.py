"""Models a newcomer builds from ``torch.nn``'s own layers: recurrent layers, PyTorch's own
transformer encoder and RMSNorm, two inputs and two outputs, batches above one.

The zoo was written for this project and the corpus (``experiments.corpus``) is models of the
``transformers`` library; neither has ``nn.GRU``, ``nn.TransformerEncoder`` (whose fused fast
path no ONNX opset has), ``nn.RMSNorm`` (which torch cannot export to ONNX at opset 17),
``F.scaled_dot_product_attention``, ``nn.PixelShuffle``, ``einsum``, ``cumsum`` or LoRA adapters
left unmerged. Each entry is
small, random weights, built like the zoo's (``experiments.models.load`` finds these names
after the corpus's)::

    python -m experiments.bench --model torch_nn --out experiments/results/torch_nn.json
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from experiments.models import ModelSpec

class UNetTiny(nn.Module):
    """Two levels of a U-Net, the skip concatenated, resized at the end."""

    def __init__(self):
        super().__init__()
        self.d1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU())
        self.d2 = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.SiLU())
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.u1 = nn.Sequential(nn.Conv2d(32, 16, 3, padding=1), nn.SiLU(), nn.Conv2d(16, 1, 1))

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(F.max_pool2d(a, 2))
        u = self.up(b)
        y = self.u1(torch.cat([a, u], 1))
        return torch.sigmoid(F.interpolate(y, scale_factor=0.5, mode="bilinear", align_corners=False))


class GRUTagger(nn.Module):
    """A tag per token from a GRU's states (torch.export unrolls its 32 steps)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(500, 64)
        self.rnn = nn.GRU(64, 64, batch_first=True)
        self.out = nn.Linear(64, 10)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.out(h)


class BiLSTMSpeech(nn.Module):
    """Frames of filter-bank features through two bidirectional nn.LSTM layers, a class per
    frame (the shape of a small speech model; torch.export unrolls 2 x 2 x 40 steps)."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(40, 48, num_layers=2, bidirectional=True)
        self.out = nn.Linear(96, 30)

    def forward(self, frames):
        h, _ = self.rnn(frames)
        return self.out(h).log_softmax(-1)


class TorchEncoder(nn.Module):
    """PyTorch's own transformer encoder, batch first, pre-norm, GELU."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True, norm_first=True, activation="gelu")
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x):
        return self.enc(x)


class TwoTower(nn.Module):
    """Two inputs, two outputs: a similarity matrix and a softmax over both towers' features."""
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(64, 128), nn.GELU(approximate="tanh"), nn.LayerNorm(128))
        self.b = nn.Sequential(nn.Conv1d(8, 32, 5, padding=2), nn.BatchNorm1d(32), nn.PReLU(), nn.AdaptiveAvgPool1d(1))

    def forward(self, x, s):
        u = self.a(x)
        v = self.b(s).flatten(1)
        return u @ u.transpose(0, 1), torch.cat([u[:, :32], v], 1).softmax(-1)


class CausalSDPA(nn.Module):
    """A pre-RMSNorm causal self-attention block with a residual."""

    def __init__(self, d=128, h=4):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.n = nn.RMSNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n(x)).chunk(3, -1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.o(y.transpose(1, 2).reshape(b, t, d))


class ESPCN(nn.Module):
    """Efficient sub-pixel super-resolution (Shi et al., 2016), upscale 3."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 64, 5, padding=2), nn.Tanh(), nn.Conv2d(64, 32, 3, padding=1), nn.Tanh(),
                                  nn.Conv2d(32, 9, 3, padding=1), nn.PixelShuffle(3))

    def forward(self, x):
        return self.body(x)


class BatchedMLP(nn.Module):
    """A classifier head over a batch of feature vectors."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 512), nn.Mish(), nn.Dropout(0.1), nn.Linear(512, 512), nn.Hardswish(),
                                 nn.Linear(512, 32))

    def forward(self, x):
        return F.log_softmax(self.net(x), -1)


class EinsumMixer(nn.Module):
    """Per-token bilinear mixing written as an einsum, summed over the sequence by cumsum."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 32, 32) * 0.1)
        self.pos = nn.Parameter(torch.randn(1, 64, 16) * 0.1)

    def forward(self, x):  # (B, 64, 16)
        y = torch.einsum("btc,cij->btij", x + self.pos, self.w).flatten(2)
        return torch.cumsum(y, dim=1)[:, -1].tanh()


class VGGish(nn.Module):
    """A small VGG-style classifier."""

    def __init__(self):
        super().__init__()
        cfg = [32, "M", 64, "M", 128, 128, "M"]
        layers, c = [], 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU6()]
                c = v
        self.f = nn.Sequential(*layers)
        self.c = nn.Sequential(nn.AdaptiveAvgPool2d((2, 2)), nn.Flatten(), nn.Linear(512, 100))

    def forward(self, x):
        return self.c(self.f(x))


class LoraLinear(nn.Module):
    """A linear layer with a LoRA adapter left unmerged, as PEFT's ``lora.Linear`` runs one
    loaded onto a base model: ``base(x) + B(A(dropout(x))) * alpha / rank``."""

    def __init__(self, features, outputs, rank=8, alpha=16, dropout=0.05):
        super().__init__()
        self.base_layer = nn.Linear(features, outputs)
        self.lora_A, self.lora_B = nn.Linear(features, rank, bias=False), nn.Linear(rank, outputs, bias=False)
        nn.init.normal_(self.lora_B.weight, std=0.02)  # PEFT starts it at zero; trained, it is not
        self.lora_dropout, self.scaling = nn.Dropout(dropout), alpha / rank

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


class LoraEncoder(nn.Module):
    """Two pre-LayerNorm encoder layers fine-tuned with LoRA on the query and value projections,
    PEFT's default targets, the adapters not merged."""

    def __init__(self, d=256, h=4, layers=2):
        super().__init__()
        self.h = h
        self.layers = nn.ModuleList(nn.ModuleDict({
            "n1": nn.LayerNorm(d), "q": LoraLinear(d, d), "k": nn.Linear(d, d), "v": LoraLinear(d, d), "o": nn.Linear(d, d),
            "n2": nn.LayerNorm(d), "up": nn.Linear(d, 4 * d), "down": nn.Linear(4 * d, d),
        }) for _ in range(layers))  # fmt: skip

    def forward(self, x):
        b, t, d = x.shape
        for layer in self.layers:
            y = layer["n1"](x)
            q, k, v = (layer[n](y).view(b, t, self.h, d // self.h).transpose(1, 2) for n in ("q", "k", "v"))
            attention = torch.softmax(q @ k.transpose(-1, -2) / (d // self.h) ** 0.5, -1) @ v
            x = x + layer["o"](attention.transpose(1, 2).reshape(b, t, d))
            x = x + layer["down"](F.gelu(layer["up"](layer["n2"](x))))
        return x


def _spec(build, shape, description, **settings) -> ModelSpec:
    return ModelSpec(build, shape, shape, description=description, **settings)


TORCH_NN: dict[str, ModelSpec] = {
    "unet_tiny": _spec(UNetTiny, (2, 3, 64, 64), "U-Net: GroupNorm, SiLU, ConvTranspose2d, skip concat, bilinear resize; batch 2"),
    "gru_tagger": _spec(GRUTagger, (1, 32), "embedding, nn.GRU over 32 tokens, linear per token",
                        dtype=torch.int64, vocab=500),
    "bilstm_speech": _spec(BiLSTMSpeech, (40, 2, 40), "2 bidirectional nn.LSTM layers over 40 frames, log-softmax per frame; batch 2"),
    "torch_encoder": _spec(TorchEncoder, (2, 32, 128), "nn.TransformerEncoder, 2 pre-norm layers, d_model 128; batch 2"),
    "two_tower": _spec(TwoTower, (4, 64), "two inputs (features; 8-channel sequence), two outputs; batch 4",
                       more_inputs=((4, 8, 50),)),
    "causal_sdpa": _spec(CausalSDPA, (1, 48, 128), "nn.RMSNorm and causal F.scaled_dot_product_attention, 48 tokens"),
    "espcn": _spec(ESPCN, (1, 1, 48, 48), "ESPCN super-resolution: tanh convolutions, nn.PixelShuffle(3)"),
    "batched_mlp": _spec(BatchedMLP, (16, 256), "MLP with Mish, Hardswish and log-softmax; batch 16"),
    "einsum_mixer": _spec(EinsumMixer, (2, 64, 16), "einsum against a weight tensor, cumsum over tokens; batch 2"),
    "vggish": _spec(VGGish, (4, 3, 32, 32), "VGG-style convolutions, ReLU6, adaptive pooling; batch 4"),
    "lora_encoder": _spec(LoraEncoder, (1, 64, 256), "2 encoder layers with unmerged LoRA adapters (rank 8) on query and value"),
}
