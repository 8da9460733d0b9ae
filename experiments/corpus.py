"""The corpus: models written by others, to judge the project on architectures it was not built around.

Every entry is a model of the ``transformers`` library built from a config with random weights
(nothing is downloaded), shrunk in depth, width and resolution only: real head sizes, norms,
activations and attention variants, at 2-4 layers, hidden sizes 64-256, 64x64-128x128 images,
64 tokens or about half a second of 16 kHz audio. ``experiments.models.load`` finds corpus
names after the zoo's, so every tool that takes a zoo name takes these too::

    w = load("swinv2")       # a Workload: w.torch, w.inputs, w.relax, w.onnx
    CORPUS["swinv2"].family  # "vision-transformer"

The corpus runs at one size (``small_input`` is ``input``). Architectures the zoo already
builds from ``transformers`` (BERT, DistilBERT, GPT-2, ViT, ConvNeXt, T5's and whisper's
encoders) are left out: the project has been tuned on them. ``python -m
experiments.corpus_check`` checks every entry: torch.export into Relax, ONNX export run by ONNX
Runtime, and TVM's output against torch's.

Tried and dropped:
- mobilevitv2: unfold, which TVM's importer cannot lower (index_tensor), and fold (col2im), not in ONNX opset 17.
- convbert: its span-based dynamic convolution is an nn.Unfold, which TVM's importer cannot lower (index_tensor).
- nystromformer: under torch.export transformers adds a (tokens, tokens) mask to (landmarks, tokens) scores.
- fnet: FFT token mixing; no FFT in TVM's importer (_fft_c2c) or in ONNX at opset 17.
- xlm: its key/value cache starts as an empty vector concatenated with the keys, which TVM's
  importer refuses (a Relax module cannot be had); collage's own import of the torch module
  skips it (``collage.model.decompositions``).
- patchtst, patchtsmixer: ``Tensor.unfold`` cuts the series into patches, which TVM's importer
  lacks (collage's import of the torch module decomposes it), and torch's ONNX export of them
  fails ONNX Runtime's shape inference.
- mixtral, olmoe: their experts' routing (histc, grouped_mm) is in neither TVM's importer nor ONNX.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from experiments.models import ModelSpec, Transformers

FAMILIES = ("vision-cnn", "vision-transformer", "hybrid", "text-encoder", "text-decoder", "audio")
# The models return hidden states, not logits, so a vocabulary's size only sets the embedding
# table's; real ones (50k-250k words) would make the weights mostly table.
VOCAB = 4096
TOKENS = 64
AUDIO_SAMPLES = 8000  # half a second at 16 kHz


@dataclass(frozen=True, kw_only=True)
class CorpusModel(ModelSpec):
    family: str


def _image(family, model, config, size, description, **settings) -> CorpusModel:
    shape = (1, 3, size, size)
    return CorpusModel(functools.partial(Transformers, model, config, **settings), shape, shape,
                       description=f"{description}, {size}x{size}", family=family)  # fmt: skip


def _text(family, model, config, description, **settings) -> CorpusModel:
    """Token ids with a tokenizer's all-ones attention mask."""
    shape = (1, TOKENS)
    build = functools.partial(Transformers, model, config, with_mask=True, vocab_size=VOCAB, **settings)
    return CorpusModel(build, shape, shape, torch.int64, f"{description}, {TOKENS} tokens", VOCAB, family=family)


def _audio(model, config, shape, description, **settings) -> CorpusModel:
    """A waveform (1, samples) or filter-bank features (1, frames, bins)."""
    return CorpusModel(functools.partial(Transformers, model, config, **settings), shape, shape,
                       description=description, family="audio")  # fmt: skip


# Text models keep a head size of 64 (hidden 256, 4 heads; hidden 128, 2 heads where the
# original is narrow); decoders run without a key/value cache, a whole sequence per call.
# BERT-style settings most text and audio encoders share, in their configs' own names:
ENCODER_256 = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024)

CORPUS: dict[str, CorpusModel] = {
    # ------------------------------------------------------------------ vision CNNs
    "resnet": _image(
        "vision-cnn", "ResNetModel", "ResNetConfig", 128, "ResNet with basic blocks (ResNet-18 style), one per stage",
        embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], layer_type="basic",
    ),
    "regnet": _image(
        "vision-cnn", "RegNetModel", "RegNetConfig", 128, "RegNetY-200MF widths, squeeze-excitation, depths 1-1-2-2",
        embedding_size=32, hidden_sizes=[24, 56, 152, 368], depths=[1, 1, 2, 2], groups_width=8, layer_type="y",
    ),
    "convnextv2": _image(
        "vision-cnn", "ConvNextV2Model", "ConvNextV2Config", 128, "ConvNeXt V2-atto widths, global response norm, depths 1-1-2-1",
        hidden_sizes=[40, 80, 160, 320], depths=[1, 1, 2, 1],
    ),
    "mobilenet_v1": _image(
        "vision-cnn", "MobileNetV1Model", "MobileNetV1Config", 128, "MobileNetV1 (width 0.25), TF 'same' padding",
        depth_multiplier=0.25, image_size=128,
    ),
    "efficientnet": _image(
        "vision-cnn", "EfficientNetModel", "EfficientNetConfig", 128, "EfficientNet, width and depth coefficients 0.5",
        # hidden_dim is the top conv's BatchNorm width, not derived: round_filters(1280) at width 0.5.
        image_size=128, width_coefficient=0.5, depth_coefficient=0.5, hidden_dim=640,
    ),
    "bit": _image(
        "vision-cnn", "BitModel", "BitConfig", 128, "BiT: pre-activation ResNet, weight-standardized convs, GroupNorm",
        embedding_size=32, hidden_sizes=[128, 256, 512, 1024], depths=[1, 1, 1, 1],
    ),
    "poolformer": _image(
        "vision-cnn", "PoolFormerModel", "PoolFormerConfig", 128, "PoolFormer (pooling token mixer), S12 at half width",
        hidden_sizes=[32, 64, 160, 256], depths=[1, 1, 2, 1],
    ),
    "textnet": _image(
        "vision-cnn", "TextNetModel", "TextNetConfig", 128, "TextNet (FAST's text-detection backbone: 3x3, 1x3 and 3x1 conv stages)",
    ),
    "dinov3_convnext": _image(
        "vision-cnn", "DINOv3ConvNextModel", "DINOv3ConvNextConfig", 128, "DINOv3's ConvNeXt (layer scale), tiny widths halved, depths 1-1-2-1",
        hidden_sizes=[48, 96, 192, 384], depths=[1, 1, 2, 1], image_size=128,
    ),
    "hgnet_v2": _image(
        "vision-cnn", "HGNetV2Backbone", "HGNetV2Config", 128, "HGNetV2-B0 (RT-DETR v2's and D-FINE's backbone: learnable affine blocks, light convs, ESE)",
    ),
    "rt_detr_resnet": _image(
        "vision-cnn", "RTDetrResNetBackbone", "RTDetrResNetConfig", 128, "RT-DETR's ResNet-vd (a 3-conv stem, average-pooled shortcuts), basic blocks",
        hidden_sizes=[64, 128, 256, 512], depths=[1, 1, 1, 1], layer_type="basic",
    ),
    # ------------------------------------------------------------------ vision transformers
    "deit": _image(
        "vision-transformer", "DeiTModel", "DeiTConfig", 128, "DeiT-tiny width (192, 3 heads), 2 layers, distillation token",
        image_size=128, hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768,
    ),
    "beit": _image(
        "vision-transformer", "BeitModel", "BeitConfig", 128, "BEiT, relative position bias, layer scale, 192 wide, 2 layers",
        image_size=128, hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768,
        use_relative_position_bias=True,
    ),
    "dinov2": _image(
        "vision-transformer", "Dinov2Model", "Dinov2Config", 112, "DINOv2 (patch 14, layer scale), 192 wide, 2 layers",
        image_size=112, hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
    ),
    "dinov3_vit": _image(
        "vision-transformer", "DINOv3ViTModel", "DINOv3ViTConfig", 128, "DINOv3 ViT (2-D rotary positions, register tokens, layer scale), 192 wide",
        image_size=128, hidden_size=192, intermediate_size=768, num_hidden_layers=2, num_attention_heads=3,
    ),
    "ijepa": _image(
        "vision-transformer", "IJepaModel", "IJepaConfig", 128, "I-JEPA (a ViT with no class token), 192 wide, 2 layers",
        image_size=128, hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768,
    ),
    "swin": _image(
        "vision-transformer", "SwinModel", "SwinConfig", 128, "Swin (shifted windows of 4), embed 32, depths 1-1-2-1",
        # 128, not 64: at 64 the last stage's 2x2 map is smaller than a window, and its mask is sized wrong.
        image_size=128, embed_dim=32, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8], window_size=4,
    ),
    "swinv2": _image(
        "vision-transformer", "Swinv2Model", "Swinv2Config", 64, "Swin V2 (cosine attention, log-spaced position MLP), embed 32",
        image_size=64, embed_dim=32, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8], window_size=4,
    ),
    "pvt": _image(
        "vision-transformer", "PvtModel", "PvtConfig", 64, "PVT (spatial-reduction attention), PVT-tiny at half width",
        image_size=64, hidden_sizes=[32, 64, 160, 256], depths=[1, 1, 1, 1],
    ),
    "pvt_v2": _image(
        "vision-transformer", "PvtV2Model", "PvtV2Config", 64, "PVTv2-b0 (overlapping patches, conv FFN), one layer per stage",
        image_size=64, depths=[1, 1, 1, 1],
    ),
    "segformer": _image(
        "vision-transformer", "SegformerModel", "SegformerConfig", 64, "SegFormer's MiT-b0 encoder, one layer per stage",
        depths=[1, 1, 1, 1],
    ),
    "clip_vision": _image(
        "vision-transformer", "CLIPVisionModel", "CLIPVisionConfig", 128, "CLIP's vision tower (pre-LN, quick GELU), 192 wide",
        image_size=128, patch_size=16, hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768,
    ),
    "siglip_vision": _image(
        "vision-transformer", "SiglipVisionModel", "SiglipVisionConfig", 128, "SigLIP's vision tower (attention-pooling head), 192 wide",
        image_size=128, patch_size=16, hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768,
    ),
    "yolos": _image(
        "vision-transformer", "YolosModel", "YolosConfig", 128, "YOLOS (ViT with 100 detection tokens), 192 wide, 2 layers",
        image_size=[128, 128], hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768,
    ),
    "hiera": _image(
        "vision-transformer", "HieraModel", "HieraConfig", 64, "Hiera (mask-unit attention, query pooling), embed 32",
        image_size=[64, 64], embed_dim=32, depths=[1, 1, 2, 1],
    ),
    "vitdet": _image(
        "vision-transformer", "VitDetModel", "VitDetConfig", 128, "ViTDet backbone (windowed and global attention, decomposed relative positions), 192 wide",
        image_size=128, pretrain_image_size=128, hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
        window_size=4, window_block_indices=[0], use_relative_position_embeddings=True,
    ),
    "sam_vision": _image(
        "vision-transformer", "SamVisionModel", "SamVisionConfig", 128, "SAM's image encoder (windowed and global attention, decomposed relative positions, conv neck)",
        image_size=128, hidden_size=192, num_hidden_layers=2, num_attention_heads=3, mlp_dim=768, window_size=4,
        global_attn_indexes=[1], output_channels=64,
    ),
    # ------------------------------------------------------------------ hybrids: convolution and attention
    "cvt": _image(
        "hybrid", "CvtModel", "CvtConfig", 96, "CvT (convolutional token embeddings and projections), depths 1-2-3",
        # Stage i reads its drop-path rate at index i of a depth-long list: stage i needs i+1 layers.
        embed_dim=[32, 96, 192], depth=[1, 2, 3],
    ),
    "levit": _image(
        "hybrid", "LevitModel", "LevitConfig", 128, "LeViT-128S widths (conv stem, attention bias), one layer per stage",
        image_size=128, hidden_sizes=[128, 256, 384], num_attention_heads=[4, 6, 8], depths=[1, 1, 1],
    ),
    "mobilevit": _image(
        "hybrid", "MobileViTModel", "MobileViTConfig", 128, "MobileViT-XXS",
        image_size=128, hidden_sizes=[64, 80, 96], neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320], expand_ratio=2.0,
    ),
    "focalnet": _image(
        "hybrid", "FocalNetModel", "FocalNetConfig", 64, "FocalNet (focal modulation), embed 32, depths 1-1-2-1",
        image_size=64, embed_dim=32, hidden_sizes=[64, 128, 256, 256], depths=[1, 1, 2, 1],
    ),
    "swiftformer": _image(
        "hybrid", "SwiftFormerModel", "SwiftFormerConfig", 128, "SwiftFormer-XS widths (additive attention), depths 1-1-2-1",
        image_size=128, depths=[1, 1, 2, 1],
    ),
    "swin2sr": _image(
        "hybrid", "Swin2SRModel", "Swin2SRConfig", 64, "Swin2SR (super-resolution: conv stem, Swin V2 blocks in residual groups), embed 48",
        image_size=64, embed_dim=48, depths=[1, 1], num_heads=[2, 2], window_size=8,
    ),
    "florence2_vision": _image(
        "hybrid", "Florence2VisionBackbone", "Florence2VisionConfig", 128, "Florence-2's DaViT (depthwise-conv positions, window and channel attention), depths 1-1-1-1",
        embed_dim=[32, 64, 128, 256], depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], num_groups=[1, 2, 4, 8],
    ),
    # ------------------------------------------------------------------ text encoders
    "roberta": _text(
        "text-encoder", "RobertaModel", "RobertaConfig", "RoBERTa, 256 wide, 2 layers",
        **ENCODER_256,
    ),
    "albert": _text(
        "text-encoder", "AlbertModel", "AlbertConfig", "ALBERT (factorized embeddings, one layer shared twice), 256 wide",
        embedding_size=128, **ENCODER_256,
    ),
    "electra": _text(
        "text-encoder", "ElectraModel", "ElectraConfig", "ELECTRA-small width, 2 layers",
        embedding_size=128, **ENCODER_256,
    ),
    "deberta": _text(
        "text-encoder", "DebertaModel", "DebertaConfig", "DeBERTa (disentangled attention, c2p and p2c), 256 wide, 2 layers",
        **ENCODER_256,
        relative_attention=True, pos_att_type=["c2p", "p2c"],
    ),
    "deberta_v2": _text(
        "text-encoder", "DebertaV2Model", "DebertaV2Config", "DeBERTa-v3 settings (shared keys, normed relative embeddings), 256 wide",
        **ENCODER_256,
        # No log buckets: their int / int is typed int by TVM's importer, and relax.log refuses it.
        # At 64 tokens every distance is under 128, where buckets begin, so they would change no position.
        relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=-1, norm_rel_ebd="layer_norm",
        share_att_key=True, max_relative_positions=-1, position_biased_input=False,
    ),
    "mpnet": _text(
        "text-encoder", "MPNetModel", "MPNetConfig", "MPNet (relative position buckets), 256 wide, 2 layers",
        **ENCODER_256,
    ),
    "funnel": _text(
        "text-encoder", "FunnelBaseModel", "FunnelConfig", "Funnel Transformer (pooled blocks, factorized relative attention), 256 wide",
        # Factorized, not relative_shift: that counts positions down with a negative-step arange, whose
        # length TVM's importer gets wrong (131 for torch's 129).
        block_sizes=[1, 1, 1], d_model=256, n_head=4, d_head=64, d_inner=1024, attention_type="factorized",
    ),
    "mobilebert": _text(
        "text-encoder", "MobileBertModel", "MobileBertConfig", "MobileBERT (bottlenecks, NoNorm, four FFNs), 2 layers",
        num_hidden_layers=2,
    ),
    "squeezebert": _text(
        "text-encoder", "SqueezeBertModel", "SqueezeBertConfig", "SqueezeBERT (grouped 1d convolutions), 256 wide, 2 layers",
        embedding_size=256, **ENCODER_256,
    ),
    "roformer": _text(
        "text-encoder", "RoFormerModel", "RoFormerConfig", "RoFormer (rotary positions), 256 wide, 2 layers",
        embedding_size=256, **ENCODER_256,
    ),
    "modernbert": _text(
        "text-encoder", "ModernBertModel", "ModernBertConfig", "ModernBERT (GeGLU, rotary, global and local attention), 3 layers",
        hidden_size=256, num_hidden_layers=3, num_attention_heads=4, intermediate_size=384,
        pad_token_id=0,  # the default (50283) is outside the shrunk vocabulary
    ),
    "bart_encoder": _text(
        "text-encoder", "BartEncoder", "BartConfig", "BART's encoder, 256 wide, 2 layers",
        d_model=256, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=1024,
    ),
    "mt5_encoder": _text(
        "text-encoder", "MT5EncoderModel", "MT5Config", "mT5's encoder (gated GELU, relative position buckets), 2 layers",
        d_model=256, d_kv=64, d_ff=640, num_layers=2, num_heads=4,
    ),
    "longt5_encoder": _text(
        "text-encoder", "LongT5EncoderModel", "LongT5Config", "LongT5's encoder (transient-global attention), 2 layers",
        d_model=256, d_kv=64, d_ff=640, num_layers=2, num_heads=4, encoder_attention_type="transient-global",
    ),
    "esm": _text(
        "text-encoder", "EsmModel", "EsmConfig", "ESM-2 (protein language model: rotary, pre-LN), 256 wide, 2 layers",
        **ENCODER_256, position_embedding_type="rotary", pad_token_id=1, mask_token_id=32,
    ),
    "rembert": _text(
        "text-encoder", "RemBertModel", "RemBertConfig", "RemBERT (decoupled input and output embeddings), 256 wide, 2 layers",
        input_embedding_size=128, output_embedding_size=256, **ENCODER_256,
    ),
    "umt5_encoder": _text(
        "text-encoder", "UMT5EncoderModel", "UMT5Config", "UMT5's encoder (a relative position bias in every layer), 2 layers",
        d_model=256, d_kv=64, d_ff=640, num_layers=2, num_heads=4,
    ),
    "xlnet": _text(
        "text-encoder", "XLNetModel", "XLNetConfig", "XLNet (two-stream relative attention, content stream), 256 wide, 2 layers",
        d_model=256, n_layer=2, n_head=4, d_inner=1024, use_mems_eval=False,
    ),
    "big_bird": _text(
        "text-encoder", "BigBirdModel", "BigBirdConfig", "BigBird (block-sparse attention: blocks of 8, one random block), 256 wide",
        **ENCODER_256, attention_type="block_sparse", block_size=8, num_random_blocks=1,
    ),
    "eurobert": _text(
        "text-encoder", "EuroBertModel", "EuroBertConfig", "EuroBERT (a Llama-style encoder: RMSNorm, SwiGLU, rotary), 2 layers",
        hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,  # the defaults are outside the shrunk vocabulary
    ),
    "canine": _text(
        "text-encoder", "CanineModel", "CanineConfig", "CANINE (characters: hashed embeddings, local attention, strided-conv downsampling)",
        **ENCODER_256,
    ),
    "xlm_roberta_xl": _text(
        "text-encoder", "XLMRobertaXLModel", "XLMRobertaXLConfig", "XLM-RoBERTa-XL (pre-LayerNorm encoder)", **ENCODER_256,
    ),
    # ------------------------------------------------------------------ text decoders
    "gpt_neo": _text(
        "text-decoder", "GPTNeoModel", "GPTNeoConfig", "GPT-Neo (global and local attention), 256 wide, 2 layers",
        hidden_size=256, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], use_cache=False,
    ),
    "opt": _text(
        "text-decoder", "OPTModel", "OPTConfig", "OPT, 256 wide, 2 layers",
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, ffn_dim=1024, word_embed_proj_dim=256,
        use_cache=False,
    ),
    "bloom": _text(
        "text-decoder", "BloomModel", "BloomConfig", "BLOOM (ALiBi), 256 wide, 2 layers",
        hidden_size=256, n_layer=2, n_head=4, use_cache=False,
    ),
    "llama": _text(
        "text-decoder", "LlamaModel", "LlamaConfig", "Llama (RMSNorm, SwiGLU, rotary, grouped-query 4/2), 2 layers",
        hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        use_cache=False,
    ),
    "mistral": _text(
        "text-decoder", "MistralModel", "MistralConfig", "Mistral (sliding window, grouped-query 4/1), 2 layers",
        hidden_size=256, intermediate_size=896, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        use_cache=False,
    ),
    "qwen2": _text(
        "text-decoder", "Qwen2Model", "Qwen2Config", "Qwen2 (QKV bias, grouped-query 4/2), 2 layers",
        hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        use_cache=False,
    ),
    "qwen3": _text(
        "text-decoder", "Qwen3Model", "Qwen3Config", "Qwen3 (query/key RMSNorm, grouped-query 4/2), 2 layers",
        hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, use_cache=False,
    ),
    "phi": _text(
        "text-decoder", "PhiModel", "PhiConfig", "Phi (parallel attention and MLP, partial rotary), 256 wide, 2 layers",
        hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, use_cache=False,
    ),
    "phi3": _text(
        "text-decoder", "Phi3Model", "Phi3Config", "Phi-3 (fused QKV and gate-up projections), 256 wide, 2 layers",
        hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        use_cache=False, pad_token_id=0,  # the default (32000) is outside the shrunk vocabulary
    ),
    "gemma": _text(
        "text-decoder", "GemmaModel", "GemmaConfig", "Gemma (GeGLU, scaled embeddings, multi-query), 2 layers",
        hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        head_dim=64, use_cache=False,
    ),
    "falcon": _text(
        "text-decoder", "FalconModel", "FalconConfig", "Falcon-7B layout (parallel attention and MLP, multi-query, fused QKV, rotary), 2 layers",
        # Its multi-query split, qkv[..., [-2], :], is why simplify wraps negative take indices.
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, ffn_hidden_size=1024, use_cache=False,
    ),
    "gptj": _text(
        "text-decoder", "GPTJModel", "GPTJConfig", "GPT-J (interleaved rotary on 16 of 64 dims), 256 wide, 2 layers",
        n_embd=256, n_layer=2, n_head=4, rotary_dim=16, use_cache=False,
    ),
    "gpt_neox": _text(
        "text-decoder", "GPTNeoXModel", "GPTNeoXConfig", "GPT-NeoX / Pythia (parallel residual, rotary 25%), 2 layers",
        **ENCODER_256, use_cache=False,
    ),
    "gpt_bigcode": _text(
        "text-decoder", "GPTBigCodeModel", "GPTBigCodeConfig", "GPTBigCode / StarCoder (multi-query), 256 wide, 2 layers",
        n_embd=256, n_layer=2, n_head=4, use_cache=False,
    ),
    "olmo2": _text(
        "text-decoder", "Olmo2Model", "Olmo2Config", "OLMo 2 (post-norm, query/key RMSNorm over all heads), 2 layers",
        hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4, use_cache=False,
        pad_token_id=0,
    ),
    "stablelm": _text(
        "text-decoder", "StableLmModel", "StableLmConfig", "StableLM (LayerNorm, rotary on 25% of each head), 2 layers",
        hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        partial_rotary_factor=0.25, use_cache=False,
    ),
    "gemma2": _text(
        "text-decoder", "Gemma2Model", "Gemma2Config", "Gemma 2 (logit soft-capping, sliding and global layers, four norms a layer)",
        hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, sliding_window=32, use_cache=False,
    ),
    "xglm": _text(
        "text-decoder", "XGLMModel", "XGLMConfig", "XGLM (sinusoidal positions, scaled embeddings), 256 wide, 2 layers",
        d_model=256, num_layers=2, attention_heads=4, ffn_dim=1024, use_cache=False,
    ),
    "mamba": _text(
        "text-decoder", "MambaModel", "MambaConfig", "Mamba (selective state space, its sequential scan), 128 wide, 2 layers",
        hidden_size=128, state_size=16, num_hidden_layers=2, use_cache=False,
    ),
    "biogpt": _text(
        "text-decoder", "BioGptModel", "BioGptConfig", "BioGPT (scaled embeddings, learned positions), 256 wide, 2 layers",
        **ENCODER_256, use_cache=False,
    ),
    "codegen": _text(
        "text-decoder", "CodeGenModel", "CodeGenConfig", "CodeGen (QKV fused in 4 blocks, rotary on 16 of 64 dims), 2 layers",
        n_embd=256, n_layer=2, n_head=4, rotary_dim=16, use_cache=False,
    ),
    "mpt": _text(
        "text-decoder", "MptModel", "MptConfig", "MPT (ALiBi, no biases, fused QKV), 256 wide, 2 layers",
        d_model=256, n_heads=4, n_layers=2, expansion_ratio=4, use_cache=False,
    ),
    "starcoder2": _text(
        "text-decoder", "Starcoder2Model", "Starcoder2Config", "StarCoder2 (grouped-query 4/2, LayerNorm, GELU MLP with biases), 2 layers",
        hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        use_cache=False,
    ),
    "lfm2": _text(
        "text-decoder", "Lfm2Model", "Lfm2Config", "LFM2 (gated short convolutions between attention layers), 4 layers",
        hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["conv", "full_attention", "conv", "full_attention"], use_cache=False, pad_token_id=0,
    ),
    "cohere": _text(
        "text-decoder", "CohereModel", "CohereConfig", "Command-R (parallel attention and MLP, bias-free LayerNorm, interleaved rotary)",
        hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    ),
    "mamba2": _text(
        "text-decoder", "Mamba2Model", "Mamba2Config", "Mamba-2 (state-space duality: a chunked scan), 128 wide, 2 layers",
        hidden_size=128, state_size=16, num_hidden_layers=2, num_heads=4, head_dim=64, n_groups=1, chunk_size=16,
        use_cache=False,
    ),
    "gemma3": _text(
        "text-decoder", "Gemma3TextModel", "Gemma3TextConfig", "Gemma 3 (sliding-window and global layers, query-key norms, scaled embeddings)",
        hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, sliding_window=16, use_cache=False,
    ),
    "nemotron": _text(
        "text-decoder", "NemotronModel", "NemotronConfig", "Nemotron (squared-ReLU MLP without a gate, LayerNorm1p, partial rotary)",
        hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        use_cache=False,
    ),
    "apertus": _text(
        "text-decoder", "ApertusModel", "ApertusConfig", "Apertus (xIELU activation, query-key norms), 2 layers",
        hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        use_cache=False,
    ),
    "bitnet": _text(
        "text-decoder", "BitNetModel", "BitNetConfig", "BitNet b1.58 as trained (ternary weights, 8-bit activations fake-quantized in float)",
        hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        use_cache=False,
    ),
    "granite": _text(
        "text-decoder", "GraniteModel", "GraniteConfig", "Granite 3 (embedding, residual and attention multipliers), 2 layers",
        hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        use_cache=False, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
    ),
    "glm4": _text(
        "text-decoder", "Glm4Model", "Glm4Config", "GLM-4 (partial rotary, post-attention and post-MLP norms, fused gate-up)",
        hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, use_cache=False, pad_token_id=0,
    ),
    "smollm3": _text(
        "text-decoder", "SmolLM3Model", "SmolLM3Config", "SmolLM3 (every other layer without rotary positions), 4 layers",
        hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        no_rope_layer_interval=2, use_cache=False, pad_token_id=0,
    ),
    "recurrent_gemma": _text(
        "text-decoder", "RecurrentGemmaModel", "RecurrentGemmaConfig", "RecurrentGemma (Griffin: RG-LRU recurrence, short conv, local attention)",
        hidden_size=256, intermediate_size=768, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
        lru_width=256, attention_window_size=32, use_cache=False,
    ),
    "rwkv": _text(
        "text-decoder", "RwkvModel", "RwkvConfig", "RWKV-4 (time mixing by the WKV recurrence, token shift), 2 layers",
        hidden_size=256, attention_hidden_size=256, intermediate_size=1024, num_hidden_layers=2, use_cache=False,
    ),
    "falcon_h1": _text(
        "text-decoder", "FalconH1Model", "FalconH1Config", "Falcon-H1 (attention and Mamba-2 heads side by side, muP multipliers)",
        hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        mamba_d_ssm=256, mamba_n_heads=4, mamba_d_head=64, mamba_d_state=16, mamba_chunk_size=16, use_cache=False,
    ),
    # ------------------------------------------------------------------ audio
    "wav2vec2": _audio(
        "Wav2Vec2Model", "Wav2Vec2Config", (1, AUDIO_SAMPLES), "wav2vec 2.0: conv feature encoder (128 channels), 2 layers",
        **ENCODER_256, conv_dim=[128] * 7,
    ),
    "hubert": _audio(
        "HubertModel", "HubertConfig", (1, AUDIO_SAMPLES), "HuBERT: conv feature encoder (128 channels), 2 layers",
        **ENCODER_256, conv_dim=[128] * 7,
    ),
    "data2vec_audio": _audio(
        "Data2VecAudioModel", "Data2VecAudioConfig", (1, AUDIO_SAMPLES), "data2vec audio (LayerNorm conv encoder, 5 conv position layers)",
        **ENCODER_256, conv_dim=[128] * 7,
    ),
    "wavlm": _audio(
        "WavLMModel", "WavLMConfig", (1, AUDIO_SAMPLES), "WavLM (gated relative position bias), 2 layers",
        **ENCODER_256, conv_dim=[128] * 7,
    ),
    "sew": _audio(
        "SEWModel", "SEWConfig", (1, AUDIO_SAMPLES), "SEW (squeezed sequence, 13 conv layers), 2 layers",
        **ENCODER_256,
        conv_dim=[64, 64, 64, 64, 64, 128, 128, 128, 128, 128, 128, 128, 128],
    ),
    "sew_d": _audio(
        "SEWDModel", "SEWDConfig", (1, AUDIO_SAMPLES), "SEW-D (squeezed sequence, disentangled attention), 2 layers",
        **ENCODER_256,
        conv_dim=[64, 64, 64, 64, 64, 128, 128, 128, 128, 128, 128, 128, 128],
        position_buckets=-1,  # as deberta_v2's: log buckets fail to import, and no distance here reaches them
    ),
    "wav2vec2_conformer": _audio(
        "Wav2Vec2ConformerModel", "Wav2Vec2ConformerConfig", (1, AUDIO_SAMPLES), "wav2vec 2.0 Conformer (relative attention, conv module)",
        **ENCODER_256, conv_dim=[128] * 7,
    ),
    "ast": _audio(
        "ASTModel", "ASTConfig", (1, 100, 128), "Audio Spectrogram Transformer: 1 s of 128-bin log-mel, 192 wide, 2 layers",
        hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768, max_length=100,
    ),
    "speech2text_encoder": _audio(
        "Speech2TextEncoder", "Speech2TextConfig", (1, 100, 80), "Speech2Text's encoder: 1 s of 80-bin filter banks, 2 layers",
        encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=1024, conv_channels=256,
    ),
    "wav2vec2_bert": _audio(
        "Wav2Vec2BertModel", "Wav2Vec2BertConfig", (1, 100, 160), "w2v-BERT 2.0 (conformer on filter-bank features, relative keys), 2 layers",
        **ENCODER_256, output_hidden_size=256,
    ),
    "moonshine_encoder": _audio(
        "MoonshineEncoder", "MoonshineConfig", (1, AUDIO_SAMPLES), "Moonshine's encoder (a conv stem on raw audio, GroupNorm, rotary), 2 layers",
        hidden_size=256, intermediate_size=1024, encoder_num_hidden_layers=2, encoder_num_attention_heads=4,
        decoder_num_hidden_layers=1, decoder_num_attention_heads=4,
    ),
    "parakeet_encoder": _audio(
        "ParakeetEncoder", "ParakeetEncoderConfig", (1, 100, 80), "Parakeet's FastConformer encoder (8x conv subsampling, relative positions), 2 layers",
        **ENCODER_256,
    ),
    "clap_audio": _audio(
        "ClapAudioModel", "ClapAudioConfig", (1, 1, 256, 64), "CLAP's audio encoder (HTSAT: a Swin on 256 frames of 64-bin mel)",
        depths=[1, 1, 2, 1], hidden_size=256, patch_embeds_hidden_size=32, spec_size=128, num_mel_bins=64, window_size=4,
    ),
    "dac_encoder": _audio(
        "DacEncoder", "DacConfig", (1, 1, AUDIO_SAMPLES), "DAC's encoder (Snake activations, weight-normed strided convs)",
        encoder_hidden_size=16, downsampling_ratios=[2, 4, 5, 8], hidden_size=256,
    ),
    "encodec_encoder": _audio(
        "EncodecEncoder", "EncodecConfig", (1, 1, AUDIO_SAMPLES), "EnCodec's encoder (strided convs, a 2-layer LSTM)",
        num_filters=16, hidden_size=128,
    ),
}  # fmt: skip
