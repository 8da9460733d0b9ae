"""torch.export writes attention's softmax as a safe softmax (0, not NaN, on a row masked out
entirely); simplify keeps the plain softmax where no row can be all -inf, and only there."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from collage.measuring.build import run_reference
from collage.model.frontend import load_torch
from collage.model.simplify import op_histogram, simplify


class Attention(nn.Module):
    """Self-attention over a normalized input, masked as ``mask`` says: None; "causal"; a
    constant boolean mask ("constant", whose last query sees nothing); or the user's additive
    mask, a second input."""

    def __init__(self, mask):
        super().__init__()
        self.mask, self.norm, self.qkv = mask, nn.LayerNorm(16), nn.Linear(16, 48)
        self.register_buffer("allowed", torch.ones(6, 6, dtype=torch.bool).tril().index_fill(0, torch.tensor([5]), False))

    def forward(self, x, additive):
        q, k, v = self.qkv(self.norm(x)).view(1, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
        if self.mask == "given":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
        if self.mask == "constant":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.allowed)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.mask == "causal")


@pytest.mark.parametrize("mask, plain", [(None, True), ("causal", True), ("constant", False), ("given", False)])
def test_the_safe_softmax_goes_only_where_no_row_can_be_masked_out_entirely(mask, plain):
    torch.manual_seed(0)
    net = Attention(mask).eval()
    x, additive = torch.randn(1, 6, 16), torch.zeros(1, 2, 6, 6)
    additive[..., 2, :] = float("-inf")  # the third query sees nothing
    simplified = simplify(load_torch(net, (x, additive)))
    histogram = op_histogram(simplified)
    assert histogram["relax.nn.softmax"] == 1 and (histogram["relax.where"] == 0) == plain
    got = run_reference(simplified["main"], [x.numpy(), additive.numpy()])[0]
    expected = net(x, additive).detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)  # masked-out rows: 0, not NaN
    if mask in ("constant", "given"):
        assert not np.isnan(got).any()
