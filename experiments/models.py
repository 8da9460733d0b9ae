"""The workload zoo: model definitions written for this project, random weights, fixed seeds.

``load(name)`` gives one model in the three forms the rest of the project consumes::

    w = load("resnet50")
    w.torch, w.inputs        # the torch module (eval mode) and example inputs
    w.relax                  # Relax IRModule, weights bound (tvm.relax.frontend.torch)
    w.onnx                   # onnx.ModelProto, opset 17, ir_version 10

Weights are random but not arbitrary: every model is built under ``torch.manual_seed``;
parameters that initialization leaves exactly zero or one (biases, normalization scales and
shifts) get a little seeded noise, as training would, so no graph rewrite can score by
deleting an ``x + 0`` or ``x * 1`` that a trained model does not have; and BatchNorm
statistics are calibrated on one random batch, so activations stay in the range a trained
network has (untouched running stats would let deep nets blow up or vanish, which hides
numerical errors behind huge or tiny outputs).

``load(name, small=True)`` builds the same architecture at the reduced input size listed
in ``SMALL_INPUTS`` (documented per model below), and where a model has one its reduced
build (``small_build``: fewer or narrower layers of every kind it has); the test suite uses
it so that TVM's untuned kernels finish in seconds.
"""

from __future__ import annotations

import functools
import importlib
import io
import os
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
import torch.nn.functional as F

SEED = 0
ONNX_OPSET = 17
ONNX_IR_VERSION = 10  # onnxruntime 1.31 loads IR <= 13; onnx 1.23 writes 14 by default


# --------------------------------------------------------------------------- building blocks


def conv_bn(cin, cout, kernel, stride=1, padding=0, groups=1, relu=True, dims=2):
    conv = (nn.Conv2d if dims == 2 else nn.Conv3d)(
        cin, cout, kernel, stride, padding, groups=groups, bias=False
    )
    layers = [conv, (nn.BatchNorm2d if dims == 2 else nn.BatchNorm3d)(cout)]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------- ResNet family


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck (stride on the 3x3); groups/width give ResNeXt."""

    expansion = 4

    def __init__(self, cin, planes, stride=1, groups=1, base_width=64):
        super().__init__()
        width = int(planes * base_width / 64) * groups
        cout = planes * self.expansion
        self.body = nn.Sequential(
            conv_bn(cin, width, 1),
            conv_bn(width, width, 3, stride, 1, groups=groups),
            conv_bn(width, cout, 1, relu=False),
        )
        self.shortcut = (
            conv_bn(cin, cout, 1, stride, relu=False)
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x):
        return F.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-50 ([3, 4, 6, 3] bottlenecks); ``groups=32, base_width=4`` is ResNeXt-50 32x4d."""

    def __init__(self, layers=(3, 4, 6, 3), groups=1, base_width=64, num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 64, 7, 2, 3), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for i, depth in enumerate(layers):
            planes = 64 * 2**i
            for j in range(depth):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(Bottleneck(cin, planes, stride, groups, base_width))
                cin = planes * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --------------------------------------------------------------------------- 3D ResNet (R3D-18)


class BasicBlock3d(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.body = nn.Sequential(
            conv_bn(cin, cout, 3, stride, 1, dims=3), conv_bn(cout, cout, 3, 1, 1, relu=False, dims=3)
        )
        self.shortcut = (
            conv_bn(cin, cout, 1, stride, relu=False, dims=3)
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x):
        return F.relu(self.body(x) + self.shortcut(x))


class R3D18(nn.Module):
    """R3D-18 (Tran et al., 2018): 3D convolutions throughout, [2, 2, 2, 2] basic blocks."""

    def __init__(self, num_classes=400):
        super().__init__()
        self.stem = conv_bn(3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3), dims=3)
        blocks, cin = [], 64
        for i, cout in enumerate((64, 128, 256, 512)):
            for j in range(2):
                blocks.append(BasicBlock3d(cin, cout, 2 if i > 0 and j == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool3d(x, 1), 1))


# --------------------------------------------------------------------------- SqueezeNet 1.1


class Fire(nn.Module):
    def __init__(self, cin, squeeze, expand):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1 = nn.Conv2d(squeeze, expand, 1)
        self.expand3 = nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.expand1(x)), F.relu(self.expand3(x))], 1)


class SqueezeNet11(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        pool = functools.partial(nn.MaxPool2d, 3, 2, ceil_mode=True)
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), pool(),
            Fire(64, 16, 64), Fire(128, 16, 64), pool(),
            Fire(128, 32, 128), Fire(256, 32, 128), pool(),
            Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256),
        )  # fmt: skip
        self.classifier = nn.Sequential(nn.Conv2d(512, num_classes, 1), nn.ReLU(inplace=True))

    def forward(self, x):
        x = self.classifier(self.features(x))
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)


# --------------------------------------------------------------------------- Inception-v3


class InceptionA(nn.Module):
    def __init__(self, cin, pool_features):
        super().__init__()
        self.b1 = conv_bn(cin, 64, 1)
        self.b5 = nn.Sequential(conv_bn(cin, 48, 1), conv_bn(48, 64, 5, padding=2))
        self.b3 = nn.Sequential(conv_bn(cin, 64, 1), conv_bn(64, 96, 3, padding=1), conv_bn(96, 96, 3, padding=1))
        self.bp = conv_bn(cin, pool_features, 1)

    def forward(self, x):
        pooled = self.bp(F.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), pooled], 1)


class InceptionB(nn.Module):  # grid reduction 35 -> 17
    def __init__(self, cin):
        super().__init__()
        self.b3 = conv_bn(cin, 384, 3, 2)
        self.b3dbl = nn.Sequential(conv_bn(cin, 64, 1), conv_bn(64, 96, 3, padding=1), conv_bn(96, 96, 3, 2))

    def forward(self, x):
        return torch.cat([self.b3(x), self.b3dbl(x), F.max_pool2d(x, 3, 2)], 1)


class InceptionC(nn.Module):  # factorized 7x7
    def __init__(self, cin, c7):
        super().__init__()
        self.b1 = conv_bn(cin, 192, 1)
        self.b7 = nn.Sequential(
            conv_bn(cin, c7, 1), conv_bn(c7, c7, (1, 7), padding=(0, 3)), conv_bn(c7, 192, (7, 1), padding=(3, 0))
        )
        self.b7dbl = nn.Sequential(
            conv_bn(cin, c7, 1),
            conv_bn(c7, c7, (7, 1), padding=(3, 0)), conv_bn(c7, c7, (1, 7), padding=(0, 3)),
            conv_bn(c7, c7, (7, 1), padding=(3, 0)), conv_bn(c7, 192, (1, 7), padding=(0, 3)),
        )  # fmt: skip
        self.bp = conv_bn(cin, 192, 1)

    def forward(self, x):
        pooled = self.bp(F.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.b1(x), self.b7(x), self.b7dbl(x), pooled], 1)


class InceptionD(nn.Module):  # grid reduction 17 -> 8
    def __init__(self, cin):
        super().__init__()
        self.b3 = nn.Sequential(conv_bn(cin, 192, 1), conv_bn(192, 320, 3, 2))
        self.b7x3 = nn.Sequential(
            conv_bn(cin, 192, 1), conv_bn(192, 192, (1, 7), padding=(0, 3)),
            conv_bn(192, 192, (7, 1), padding=(3, 0)), conv_bn(192, 192, 3, 2),
        )  # fmt: skip

    def forward(self, x):
        return torch.cat([self.b3(x), self.b7x3(x), F.max_pool2d(x, 3, 2)], 1)


class InceptionE(nn.Module):  # expanded filter bank
    def __init__(self, cin):
        super().__init__()
        self.b1 = conv_bn(cin, 320, 1)
        self.b3 = conv_bn(cin, 384, 1)
        self.b3a, self.b3b = conv_bn(384, 384, (1, 3), padding=(0, 1)), conv_bn(384, 384, (3, 1), padding=(1, 0))
        self.b3dbl = nn.Sequential(conv_bn(cin, 448, 1), conv_bn(448, 384, 3, padding=1))
        self.b3dbla, self.b3dblb = conv_bn(384, 384, (1, 3), padding=(0, 1)), conv_bn(384, 384, (3, 1), padding=(1, 0))
        self.bp = conv_bn(cin, 192, 1)

    def forward(self, x):
        a, b = self.b3(x), self.b3dbl(x)
        return torch.cat(
            [
                self.b1(x),
                self.b3a(a), self.b3b(a),
                self.b3dbla(b), self.b3dblb(b),
                self.bp(F.avg_pool2d(x, 3, 1, 1)),
            ],
            1,
        )  # fmt: skip


class InceptionV3(nn.Module):
    """Inception-v3 (Szegedy et al., 2016) in inference form: no auxiliary classifier."""

    def __init__(self, num_classes=1000, each_block_once=False):
        super().__init__()
        self.stem = nn.Sequential(
            conv_bn(3, 32, 3, 2), conv_bn(32, 32, 3), conv_bn(32, 64, 3, padding=1), nn.MaxPool2d(3, 2),
            conv_bn(64, 80, 1), conv_bn(80, 192, 3), nn.MaxPool2d(3, 2),
        )  # fmt: skip
        if each_block_once:  # the test suite's build: every kind of block, each once (5 of 11)
            blocks = [InceptionA(192, 32), InceptionB(256), InceptionC(736, 128), InceptionD(768), InceptionE(1280)]
        else:
            blocks = [
                InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64),
                InceptionB(288),
                InceptionC(768, 128), InceptionC(768, 160), InceptionC(768, 160), InceptionC(768, 192),
                InceptionD(768),
                InceptionE(1280), InceptionE(2048),
            ]  # fmt: skip
        self.mixed = nn.Sequential(*blocks)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x):
        x = self.mixed(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --------------------------------------------------------------------------- DCGAN generator


class DCGANGenerator(nn.Module):
    """DCGAN generator (Radford et al., 2016): latent 100x1x1 -> image 3x64x64."""

    def __init__(self, nz=100, ngf=64):
        super().__init__()

        def up(cin, cout, stride, pad):
            return [nn.ConvTranspose2d(cin, cout, 4, stride, pad, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)]

        self.net = nn.Sequential(
            *up(nz, ngf * 8, 1, 0), *up(ngf * 8, ngf * 4, 2, 1), *up(ngf * 4, ngf * 2, 2, 1), *up(ngf * 2, ngf, 2, 1),
            nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False), nn.Tanh(),
        )  # fmt: skip

    def forward(self, z):
        return self.net(z)


# --------------------------------------------------------------------------- NASNet-A (mobile)

# NASNet-A cells (Zoph et al., 2018) as (operation, input) pairs, two per block; inputs 0 and 1
# are the two previous cells' outputs, 2.. the blocks of this cell. Same cell as NASNet-A in
# the DARTS genotype listing.
NASNET_NORMAL = [
    ("sep5", 1), ("sep3", 0), ("sep5", 0), ("sep3", 0), ("avg3", 1),
    ("skip", 0), ("avg3", 0), ("avg3", 0), ("sep3", 1), ("skip", 1),
]  # fmt: skip
NASNET_NORMAL_CONCAT = [2, 3, 4, 5, 6]
NASNET_REDUCE = [
    ("sep5", 0), ("sep7", 1), ("max3", 0), ("sep7", 1), ("avg3", 0),
    ("sep5", 1), ("skip", 3), ("avg3", 2), ("sep3", 2), ("max3", 1),
]  # fmt: skip
NASNET_REDUCE_CONCAT = [4, 5, 6]


class SepConv(nn.Module):
    """NASNet's separable convolution: (ReLU, depthwise, pointwise, BN) twice."""

    def __init__(self, c, k, stride):
        super().__init__()

        def half(s):
            return [
                nn.ReLU(False), nn.Conv2d(c, c, k, s, k // 2, groups=c, bias=False),
                nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c),
            ]  # fmt: skip

        self.op = nn.Sequential(*half(stride), *half(1))

    def forward(self, x):
        return self.op(x)


class FactorizedReduce(nn.Module):
    """Halves resolution without losing pixels: two offset stride-2 1x1 convolutions."""

    def __init__(self, cin, cout):
        super().__init__()
        self.a = nn.Conv2d(cin, cout // 2, 1, 2, bias=False)
        self.b = nn.Conv2d(cin, cout - cout // 2, 1, 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        x = F.relu(x)
        return self.bn(torch.cat([self.a(x), self.b(x[:, :, 1:, 1:])], 1))


def nasnet_op(name, c, stride):
    if name.startswith("sep"):
        return SepConv(c, int(name[3]), stride)
    if name == "avg3":
        return nn.AvgPool2d(3, stride, 1, count_include_pad=False)
    if name == "max3":
        return nn.MaxPool2d(3, stride, 1)
    return nn.Identity() if stride == 1 else FactorizedReduce(c, c)  # skip


class NASNetCell(nn.Module):
    def __init__(self, c_pp, c_p, c, reduction, reduction_prev):
        super().__init__()
        relu_conv_bn = lambda cin: nn.Sequential(nn.ReLU(False), *conv_bn(cin, c, 1, relu=False))  # noqa: E731
        self.pre0 = FactorizedReduce(c_pp, c) if reduction_prev else relu_conv_bn(c_pp)
        self.pre1 = relu_conv_bn(c_p)
        genotype = NASNET_REDUCE if reduction else NASNET_NORMAL
        self.concat = NASNET_REDUCE_CONCAT if reduction else NASNET_NORMAL_CONCAT
        self.inputs = [i for _, i in genotype]
        self.ops = nn.ModuleList(
            nasnet_op(name, c, 2 if reduction and i < 2 else 1) for name, i in genotype
        )
        self.out_channels = c * len(self.concat)

    def forward(self, s0, s1):
        states = [self.pre0(s0), self.pre1(s1)]
        for k in range(0, len(self.ops), 2):
            a, b = self.ops[k], self.ops[k + 1]
            states.append(a(states[self.inputs[k]]) + b(states[self.inputs[k + 1]]))
        return torch.cat([states[i] for i in self.concat], 1)


class NASNetAMobile(nn.Module):
    """NASNet-A Mobile (4 @ 1056): 3x3/2 stem, two stem reduction cells, 3 stages of 4 normal
    cells with reduction cells between, 44 channels per block in the first stage."""

    def __init__(self, c=44, cells_per_stage=4, num_classes=1000):
        super().__init__()
        self.stem = conv_bn(3, 32, 3, 2, 1, relu=False)
        c_pp = c_p = 32
        cells, reduction_prev = [], False
        # Stem reductions at c/4 and c/2, then the three stages at c, 2c, 4c.
        plan = [(c // 4, True), (c // 2, True)]
        for stage in range(3):
            if stage > 0:
                plan.append((c * 2**stage, True))
            plan += [(c * 2**stage, False)] * cells_per_stage
        for cell_c, reduction in plan:
            cell = NASNetCell(c_pp, c_p, cell_c, reduction, reduction_prev)
            cells.append(cell)
            c_pp, c_p, reduction_prev = c_p, cell.out_channels, reduction
        self.cells = nn.ModuleList(cells)
        self.fc = nn.Linear(c_p, num_classes)

    def forward(self, x):
        s0 = s1 = self.stem(x)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(F.relu(s1), 1), 1))


# --------------------------------------------------------------------------- MobileNetV2


def conv_bn_relu6(cin, cout, kernel, stride=1, groups=1):
    """Conv + BN + ReLU6 with "same" padding for odd kernels, MobileNetV2's unit."""
    return nn.Sequential(*conv_bn(cin, cout, kernel, stride, kernel // 2, groups, relu=False), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand (ReLU6), 3x3 depthwise (ReLU6), 1x1 linear projection,
    and the identity shortcut when the block keeps both resolution and width."""

    def __init__(self, cin, cout, stride, expand_ratio):
        super().__init__()
        hidden = cin * expand_ratio
        # With t = 1 the expansion would be a square 1x1 conv on the input; the reference
        # architecture (and torchvision) leaves it out, so the first block is depthwise first.
        expand = [conv_bn_relu6(cin, hidden, 1)] if expand_ratio != 1 else []
        self.body = nn.Sequential(
            *expand,
            conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            conv_bn(hidden, cout, 1, relu=False),  # linear bottleneck: no activation
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


# (expansion t, output channels c, repeats n, first stride s), Sandler et al., 2018, Table 2.
MOBILENET_V2_BLOCKS = [
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
]  # fmt: skip


class MobileNetV2(nn.Module):
    """MobileNetV2 (Sandler et al., 2018), width 1.0: 3x3/2 stem, 17 inverted residual blocks,
    1x1 conv to 1280, global average pool, linear classifier. The classifier's dropout is
    left out: it is the identity in inference."""

    def __init__(self, num_classes=1000):
        super().__init__()
        layers, cin = [conv_bn_relu6(3, 32, 3, 2)], 32
        for t, c, n, s in MOBILENET_V2_BLOCKS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn_relu6(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1280, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# --------------------------------------------------------------------------- keyword spotting DS-CNN


class KWSDSCNN(nn.Module):
    """DS-CNN "S" keyword spotter (Zhang et al., 2017, "Hello Edge"): MFCC features 49x10
    (49 frames of 10 coefficients) -> 12 classes; one 10x4/2 conv to 64 channels, four
    depthwise-separable blocks at 64 channels, global average pool, linear.

    About 23k parameters and 2.7M multiply-adds: the arithmetic takes microseconds, so a
    backend's per-call overhead (kernel launches, engine entry, copies) weighs as much.
    """

    def __init__(self, channels=64, blocks=4, num_classes=12):
        super().__init__()
        # The original pads "SAME" (4 above, 5 below on the frame axis); torch pads
        # symmetrically, and (5, 1) gives the same 25x5 output grid.
        layers = [conv_bn(1, channels, (10, 4), 2, (5, 1))]
        for _ in range(blocks):
            layers += [conv_bn(channels, channels, 3, 1, 1, groups=channels), conv_bn(channels, channels, 1)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# --------------------------------------------------------------------------- MobileNetV3 / EfficientNet blocks


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation (Hu et al., 2018): global average pool, 1x1 reduce, activation,
    1x1 expand, a gate (sigmoid, or MobileNetV3's hard sigmoid) scaling each channel."""

    def __init__(self, c, reduced, act, gate):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, reduced, 1), nn.Conv2d(reduced, c, 1)
        self.act, self.gate = act(), gate()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.expand(self.act(self.reduce(s))))


class MBConv(nn.Module):
    """The inverted residual of MobileNetV3 and EfficientNet: 1x1 expand, k x k depthwise,
    optional squeeze-excitation, 1x1 linear projection, identity shortcut when shapes allow."""

    def __init__(self, cin, cout, kernel, stride, expand, se, act):
        super().__init__()
        hidden = cin * expand
        layers = []
        if expand != 1:
            layers += [*conv_bn(cin, hidden, 1, relu=False), act()]
        layers += [*conv_bn(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, relu=False), act()]
        if se:
            gate = nn.Hardsigmoid if act is nn.Hardswish else nn.Sigmoid
            layers.append(SqueezeExcite(hidden, max(8, cin // 4), nn.ReLU if act is nn.Hardswish else act, gate))
        layers += conv_bn(hidden, cout, 1, relu=False)
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


# (kernel, expansion, output channels, squeeze-excitation, activation, stride): MobileNetV3-Large's
# shape with EfficientNet-B0's SiLU stages mixed in, so one model has every activation of both.
MBCONV_BLOCKS = [
    (3, 1, 16, False, nn.ReLU, 1), (3, 4, 24, False, nn.ReLU, 2), (3, 3, 24, False, nn.ReLU, 1),
    (5, 3, 40, True, nn.SiLU, 2), (5, 3, 40, True, nn.SiLU, 1), (3, 6, 80, False, nn.Hardswish, 2),
    (3, 4, 80, False, nn.Hardswish, 1), (3, 6, 112, True, nn.Hardswish, 1), (5, 6, 160, True, nn.SiLU, 2),
    (5, 6, 160, True, nn.Hardswish, 1),
]  # fmt: skip


# The test suite's: one block of each kind (ReLU without SE; SiLU with SE; hard-swish with
# hard-sigmoid SE and the identity shortcut).
MBCONV_BLOCKS_SMALL = [(3, 4, 24, False, nn.ReLU, 2), (5, 3, 40, True, nn.SiLU, 2), (3, 4, 40, True, nn.Hardswish, 1)]


class MBConvNet(nn.Module):
    """A MobileNetV3/EfficientNet-style classifier: 3x3/2 stem (hard-swish), ten MBConv blocks
    with squeeze-excitation, SiLU and hard-swish, 1x1 conv to ``head`` (960), pool, linear."""

    def __init__(self, blocks=MBCONV_BLOCKS, head=960, num_classes=1000):
        super().__init__()
        layers, cin = [*conv_bn(3, 16, 3, 2, 1, relu=False), nn.Hardswish()], 16
        for kernel, expand, cout, se, act, stride in blocks:
            layers.append(MBConv(cin, cout, kernel, stride, expand, se, act))
            cin = cout
        layers += [*conv_bn(cin, head, 1, relu=False), nn.Hardswish()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(head, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# --------------------------------------------------------------------------- models written by others


class Transformers(nn.Module):
    """A model of the ``transformers`` library built from a config with random weights
    (nothing is downloaded), returning its last hidden state (a backbone's deepest feature map,
    a codec encoder's latents): code written by others, as users run it. ``attn_implementation="eager"`` keeps attention as plain ops (SDPA is not exported
    by every path); ``$CORPUS_ATTENTION`` names another (``sdpa``, transformers' own default,
    which ``torch.export`` decomposes before TVM imports it)."""

    def __init__(self, model: str, config: str, with_mask: bool = False, **settings):
        super().__init__()
        import transformers

        self.with_mask = with_mask
        cfg = getattr(transformers, config)(**settings)
        cfg._attn_implementation = os.environ.get("CORPUS_ATTENTION", "eager")
        # Looked up in the modeling module beside the config's, not at the top level: an encoder
        # alone (WhisperEncoder, BartEncoder), as speech front ends run it, is exported only there.
        modeling = importlib.import_module(type(cfg).__module__.replace(".configuration_", ".modeling_"))
        self.model = getattr(modeling, model)(cfg)

    def forward(self, x):
        if self.with_mask:  # an all-ones attention mask, as a tokenizer gives it
            out = self.model(x, attention_mask=torch.ones_like(x))
        else:
            out = self.model(x)
        if isinstance(out, torch.Tensor):  # a codec's encoder alone returns its latents
            return out
        if getattr(out, "last_hidden_state", None) is None:  # a backbone: its deepest feature map
            return out.feature_maps[-1]
        return out.last_hidden_state


def _transformers(model, config, full, small, **kw):
    """(build, small build) of a transformers model: ``full`` settings as benchmarked, ``small``
    ones for the test suite."""
    return (functools.partial(Transformers, model, config, **kw, **full),
            functools.partial(Transformers, model, config, **kw, **small))  # fmt: skip


# The small configs keep the full vocabularies, so token ids drawn for either build are valid.
# No key/value cache: a whole sequence in one call. With it, the empty cache is concatenated to
# the keys (a 1-d tensor with a 4-d one), which torch allows and TVM's torch frontend refuses.
# Without an attention mask, transformers looks for packed sequences with torch.diff, which
# ONNX cannot export; a tokenizer's all-ones mask is what users pass anyway.
GPT2 = _transformers(
    "GPT2Model", "GPT2Config", dict(use_cache=False), dict(n_layer=2, n_embd=64, n_head=2, n_positions=64, use_cache=False),
    with_mask=True,
)  # fmt: skip
DISTILBERT = _transformers(
    "DistilBertModel", "DistilBertConfig", {}, dict(n_layers=2, dim=64, n_heads=2, hidden_dim=128)
)
T5_ENCODER = _transformers(
    "T5EncoderModel", "T5Config", dict(d_model=512, d_ff=2048, num_layers=6, num_heads=8),
    dict(d_model=64, d_ff=128, d_kv=32, num_layers=2, num_heads=2),
)  # fmt: skip
VIT = _transformers(
    "ViTModel", "ViTConfig", {},
    dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
)  # fmt: skip
CONVNEXT = _transformers(
    "ConvNextModel", "ConvNextConfig", {}, dict(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128])
)
WHISPER_ENCODER = _transformers(
    "WhisperEncoder", "WhisperConfig",
    dict(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536),  # whisper-tiny
    dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128, max_source_positions=50),
)  # fmt: skip


# --------------------------------------------------------------------------- MLP and transformers


class MLP(nn.Module):
    """A small MLP: 784 -> 512 -> 256 -> 10, ReLU between."""

    def __init__(self, sizes=(784, 512, 256, 10)):
        super().__init__()
        layers = []
        for cin, cout in zip(sizes, sizes[1:]):
            layers += [nn.Linear(cin, cout), nn.ReLU()]
        self.net = nn.Sequential(*layers[:-1])

    def forward(self, x):
        return self.net(x)


class BertEncoder(nn.Module):
    """transformers' BertModel (BERT-base config, nothing downloaded); returns the last hidden state.

    Eager attention keeps the exported graph to plain matmul/softmax ops that every
    backend understands; the attention mask is all ones, so it is left out of the signature.
    """

    def __init__(self, **config):
        super().__init__()
        from transformers import BertConfig, BertModel

        cfg = BertConfig(attn_implementation="eager", **config)
        self.bert = BertModel(cfg, add_pooling_layer=False)

    def forward(self, input_ids):
        return self.bert(input_ids=input_ids).last_hidden_state


class SelfAttention(nn.Module):
    """Multi-head self-attention as plain ops: three projections, reshape/permute into heads,
    scaled ``q @ k^T``, softmax, ``@ v``, heads merged back, output projection."""

    def __init__(self, d_model, heads):
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.q, self.k, self.v, self.out = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x):
        b, s, d = x.shape
        split = lambda t: t.reshape(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = torch.matmul(q, k.permute(0, 1, 3, 2)) * self.head_dim**-0.5
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out(ctx.permute(0, 2, 1, 3).reshape(b, s, d))


class EncoderLayer(nn.Module):
    """Post-LayerNorm encoder layer, as in BERT: ``x = LN(x + attn(x)); x = LN(x + ffn(x))``."""

    def __init__(self, d_model, heads, d_ff):
        super().__init__()
        self.attn = SelfAttention(d_model, heads)
        self.norm1 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x):
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ffn(x))


class TransformerEncoder(nn.Module):
    """A small transformer encoder written out by hand: token embedding (1000-word vocabulary)
    plus a learned position embedding, 2 post-LN layers of d_model 256, 4 heads, GELU
    feed-forward 1024; returns the last hidden state.

    Not ``nn.TransformerEncoderLayer``: its inference fast path goes through fused kernels
    (``_transformer_encoder_layer_fwd``) that export badly; here attention stays plain
    matmul / softmax / reshape / permute. No attention mask: every position is a real token.
    """

    def __init__(self, vocab=1000, max_len=64, d_model=256, heads=4, d_ff=1024, layers=2):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        # BERT's initialization scale (std 0.02) for the learned positions; a shorter
        # sequence uses the first rows.
        self.positions = nn.Parameter(torch.randn(1, max_len, d_model) * 0.02)
        # Post-LN layers expect normalized input, so the embedding sum is normalized first (BERT does too).
        self.norm = nn.LayerNorm(d_model)
        self.layers = nn.Sequential(*(EncoderLayer(d_model, heads, d_ff) for _ in range(layers)))

    def forward(self, input_ids):
        x = self.tokens(input_ids) + self.positions[:, : input_ids.shape[1]]
        return self.layers(self.norm(x))


# --------------------------------------------------------------------------- the zoo


@dataclass(frozen=True)
class ModelSpec:
    build: Callable[[], nn.Module]
    input: tuple[int, ...]  # full size, as benchmarked
    small_input: tuple[int, ...]  # reduced size for the test suite
    dtype: torch.dtype = torch.float32
    description: str = ""
    vocab: int | None = None  # int64 inputs are token ids in [0, vocab)
    small_build: Callable[[], nn.Module] | None = None  # a reduced config for the test suite, if any
    more_inputs: tuple[tuple[int, ...], ...] = ()  # the shapes of float32 inputs after the first, if any


MODELS: dict[str, ModelSpec] = {
    # The test suite's ResNets: five bottlenecks (2, 1, 1, 1) of the sixteen, every stage's
    # projection block and an identity one.
    "resnet50": ModelSpec(ResNet, (1, 3, 224, 224), (1, 3, 64, 64), description="ResNet-50",
                          small_build=functools.partial(ResNet, layers=(2, 1, 1, 1))),
    "resnext50": ModelSpec(
        functools.partial(ResNet, groups=32, base_width=4), (1, 3, 224, 224), (1, 3, 64, 64),
        description="ResNeXt-50 (32x4d)",
        small_build=functools.partial(ResNet, layers=(2, 1, 1, 1), groups=32, base_width=4),
    ),
    "inception_v3": ModelSpec(InceptionV3, (1, 3, 299, 299), (1, 3, 107, 107), description="Inception-v3",
                              small_build=functools.partial(InceptionV3, each_block_once=True)),
    "squeezenet": ModelSpec(SqueezeNet11, (1, 3, 224, 224), (1, 3, 64, 64), description="SqueezeNet 1.1"),
    "dcgan": ModelSpec(DCGANGenerator, (1, 100, 1, 1), (1, 100, 1, 1), description="DCGAN generator",
                       small_build=functools.partial(DCGANGenerator, ngf=16)),  # its layers at a quarter of the width
    # The test suite's builds keep every kind of cell or block, each fewer times.
    "nasnet_mobile": ModelSpec(NASNetAMobile, (1, 3, 224, 224), (1, 3, 64, 64), description="NASNet-A (mobile)",
                               small_build=functools.partial(NASNetAMobile, cells_per_stage=1)),
    "r3d18": ModelSpec(R3D18, (1, 3, 8, 112, 112), (1, 3, 4, 32, 32), description="R3D-18, 8-frame 112x112 clip"),
    "bert": ModelSpec(
        BertEncoder, (1, 128), (1, 16), torch.int64, description="BERT-base, sequence length 128", vocab=30522,
        # The test suite's: BERT's every operator at 2 layers, 128 wide (BERT-base's 110M weights
        # took each test that compiles it 10-30 s).
        small_build=functools.partial(BertEncoder, num_hidden_layers=2, hidden_size=128, num_attention_heads=2,
                                      intermediate_size=512),
    ),
    "mlp": ModelSpec(MLP, (1, 784), (1, 784), description="MLP 784-512-256-10"),
    "mobilenet_v2": ModelSpec(MobileNetV2, (1, 3, 224, 224), (1, 3, 64, 64), description="MobileNetV2 (width 1.0)"),
    "transformer_encoder": ModelSpec(
        TransformerEncoder, (1, 64), (1, 16), torch.int64,
        description="2-layer transformer encoder, d_model 256, sequence length 64", vocab=1000,
    ),  # fmt: skip
    "kws_dscnn": ModelSpec(
        KWSDSCNN, (1, 1, 49, 10), (1, 1, 49, 10), description="DS-CNN (S) keyword spotting, 49x10 MFCC"
    ),
    "mbconv": ModelSpec(
        MBConvNet, (1, 3, 224, 224), (1, 3, 64, 64),
        description="MobileNetV3/EfficientNet-style MBConv net: squeeze-excitation, SiLU, hard-swish",
        small_build=functools.partial(MBConvNet, MBCONV_BLOCKS_SMALL, head=128),
    ),  # fmt: skip
    # Written by others: transformers' models with random weights, full configs (GPT-2 small,
    # DistilBERT base, ViT-B/16, ConvNeXt-T, whisper-tiny's encoder, T5-small's encoder); the
    # test suite builds each at a tiny config (``small_build``).
    "gpt2": ModelSpec(GPT2[0], (1, 64), (1, 16), torch.int64, "GPT-2 (124M), 64 tokens", 50257, GPT2[1]),
    "distilbert": ModelSpec(
        DISTILBERT[0], (1, 128), (1, 16), torch.int64, "DistilBERT base, 128 tokens", 30522, DISTILBERT[1]
    ),
    "vit": ModelSpec(VIT[0], (1, 3, 224, 224), (1, 3, 32, 32), description="ViT-B/16, 224x224", small_build=VIT[1]),
    "convnext": ModelSpec(
        CONVNEXT[0], (1, 3, 224, 224), (1, 3, 64, 64), description="ConvNeXt-T, 224x224", small_build=CONVNEXT[1]
    ),
    "whisper_encoder": ModelSpec(
        WHISPER_ENCODER[0], (1, 80, 3000), (1, 80, 100), description="whisper-tiny's encoder, 30 s of audio",
        small_build=WHISPER_ENCODER[1],
    ),  # fmt: skip
    "t5_encoder": ModelSpec(
        T5_ENCODER[0], (1, 64), (1, 16), torch.int64, "T5-small's encoder, 64 tokens", 32128, T5_ENCODER[1]
    ),
}
# Reduced input sizes (small=True): CNNs at 64x64 except Inception-v3 at 107x107 (its
# unpadded stride-2 chain needs at least 75x75), R3D-18 on a 4x32x32 clip, BERT and the
# small transformer encoder at sequence length 16. DCGAN, the MLP and the keyword spotter
# (already tiny) run at full size.
SMALL_INPUTS = {name: spec.small_input for name, spec in MODELS.items()}


def random_inputs(spec: ModelSpec, shape, seed=SEED) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    if spec.dtype == torch.int64:  # token ids, in range for the model's embedding table
        if spec.vocab is None:
            raise ValueError(f"{spec.description or spec.build}: int64 input needs ModelSpec.vocab")
        first = torch.randint(0, spec.vocab, shape, generator=g)
    else:
        first = torch.randn(shape, generator=g)
    return (first, *(torch.randn(more, generator=g) for more in spec.more_inputs))


@torch.no_grad()
def _perturb_constant_parameters(net: nn.Module, std: float = 0.02) -> None:
    for p in net.parameters():
        if p.numel() > 1 and (torch.all(p == 0) or torch.all(p == 1)):
            p.add_(torch.randn_like(p) * std)


@torch.no_grad()
def _calibrate_batchnorm(net: nn.Module, examples: tuple[torch.Tensor, ...]) -> None:
    """Set BatchNorm running statistics from a random batch (cumulative average, one pass):
    the examples, each repeated to a batch of two where it is one."""
    bns = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    net.train()
    net(*(x.expand(2, *x.shape[1:]).contiguous() if x.shape[0] == 1 else x for x in examples))
    net.eval()


def model_spec(name: str) -> ModelSpec:
    """The zoo's model ``name``, or else the corpus's (``experiments.corpus``), or else the
    torch.nn set's (``experiments.torch_nn``)."""
    if name in MODELS:
        return MODELS[name]
    # Imported here: both are built from this module.
    from experiments.corpus import CORPUS
    from experiments.torch_nn import TORCH_NN

    for specs in (CORPUS, TORCH_NN):
        if name in specs:
            return specs[name]
    raise KeyError(f"unknown model {name!r}; the zoo has: {', '.join(MODELS)}; the corpus: {', '.join(CORPUS)}; "
                   f"the torch.nn set: {', '.join(TORCH_NN)}")


class Workload:
    """One zoo or corpus model in every form; the IR forms are built on first use and then kept."""

    def __init__(self, name: str, small: bool = False, seed: int = SEED):
        self.name, self.small, self.spec = name, small, model_spec(name)
        self.input_shape = self.spec.small_input if small else self.spec.input
        torch.manual_seed(seed)
        build = self.spec.small_build if small and self.spec.small_build is not None else self.spec.build
        net = build().eval()
        _perturb_constant_parameters(net)
        self.inputs = random_inputs(self.spec, self.input_shape, seed)
        if self.spec.dtype.is_floating_point:
            _calibrate_batchnorm(net, self.inputs)
        self.torch = net

    def __repr__(self):
        return f"Workload({self.name!r}, input={self.input_shape})"

    @functools.cached_property
    def exported(self) -> torch.export.ExportedProgram:
        with torch.no_grad():
            return torch.export.export(self.torch, self.inputs)

    @functools.cached_property
    def relax(self):
        """Relax IRModule with the weights bound as constants; ``main`` takes the inputs only."""
        from tvm.relax.frontend.torch import from_exported_program

        return from_exported_program(self.exported, keep_params_as_input=False)

    @functools.cached_property
    def onnx(self):
        """ONNX model at opset 17. The TorchScript exporter writes opset 17 natively; the dynamo
        exporter starts at 18 and its down-conversion fails on Reduce ops."""
        import onnx

        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(
                self.torch, self.inputs, buffer, dynamo=False, opset_version=ONNX_OPSET,
                input_names=[f"input{i}" for i in range(len(self.inputs))],
            )  # fmt: skip
        model = onnx.load_from_string(buffer.getvalue())
        model.ir_version = ONNX_IR_VERSION
        onnx.checker.check_model(model)
        return model

    @torch.no_grad()
    def reference(self) -> list:
        """The torch outputs for ``inputs``, as numpy arrays (a list even for one output)."""
        out = self.torch(*self.inputs)
        return [t.numpy() for t in (out if isinstance(out, (tuple, list)) else (out,))]


def load(name: str, small: bool = False, seed: int = SEED) -> Workload:
    return Workload(name, small, seed)
