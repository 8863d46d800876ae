"""A tiny Qwen3-Omni (`qwen3_omni_moe`): only its thinker, the part that reads text, images and audio and writes
text (its config's `enable_audio_output` false, so that mlx-vlm builds no talker nor code2wav: the thinker is what
`mlx_vlm.generate` needs to answer about an image), built as tests/vlms/qwen.py builds Qwen3-VL
(read its docstring): Qwen3-VL's tokens and template, with the audio ones added (<|audio_start|>, <|audio_end|>,
<|audio_pad|>: an audio part renders <|audio_start|><|audio_pad|><|audio_end|>); mlx-vlm's own
Qwen3OmniMoeProcessor, whose image processor is Qwen3-VL's (patch 16, merge 2: a 32x32 image is one token) and whose
feature extractor is transformers' WhisperFeatureExtractor (128 mel bins), both read from preprocessor_config.json.

Its configs nest as the hub's do: `thinker_config` holds the text model (hidden 64, 2 layers, 4 heads of 16, 2 KV
heads, interleaved M-RoPE [2, 3, 3]; each layer's MLP a mixture of 4 experts, 2 a token), the vision tower (hidden
32, 2 layers, a deepstack merger after its first) and the audio tower (d_model 32, one layer), with the image, video
and audio token ids; `talker_config` names a text model too (the config cannot be read without one) that nothing
builds. Keys as the hub names them (`thinker.model.*`, `thinker.visual.*` with its mergers' `ln_q` and `mlp.0/2`,
`thinker.audio_tower.*`, `thinker.lm_head.*`), the experts' weights stacked as mlx-vlm keeps them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import Family, added_ids, write_folder
from tests.vlms.qwen import CONTEXT, EOS, TEMPLATE3
from tests.vlms.qwen import TOKENS as QWEN_TOKENS

AUDIO_TOKENS = ["<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"]
TOKENS = [*QWEN_TOKENS, *AUDIO_TOKENS]
IDS = added_ids(TOKENS)
PATCH, MERGE = 16, 2

#: Qwen3-Omni's template (Qwen/Qwen3-Omni-30B-A3B-*, without its tool-calling branch): Qwen3-VL's, and audio parts
TEMPLATE = TEMPLATE3.replace(
    "{%- elif content['type'] == 'video'",
    "{%- elif content['type'] == 'audio' or 'audio' in content %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{%- elif content['type'] == 'video'",
)
TEXT: dict[str, Any] = dict(
    model_type="qwen3_omni_moe_text", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
    vocab_size=max(IDS.values()) + 1, max_position_embeddings=CONTEXT, rope_theta=10000.0,
    rope_scaling=dict(rope_type="default", mrope_section=[2, 3, 3], interleaved=True, mrope_interleaved=True),
    tie_word_embeddings=False, hidden_act="silu", torch_dtype="float32",
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="qwen3_omni_moe_vision_encoder", depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
    out_hidden_size=TEXT["hidden_size"], patch_size=PATCH, spatial_patch_size=PATCH, spatial_merge_size=MERGE,
    temporal_patch_size=2, in_channels=3, num_position_embeddings=16, deepstack_visual_indexes=[0],
    hidden_act="gelu_pytorch_tanh", image_size=PATCH * 4,
)  # fmt: skip
AUDIO: dict[str, Any] = dict(
    model_type="qwen3_omni_moe_audio_encoder", d_model=32, encoder_layers=1, num_hidden_layers=1,
    encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=128, output_dim=TEXT["hidden_size"],
    downsample_hidden_size=16, max_source_positions=1500,
)  # fmt: skip
THINKER: dict[str, Any] = dict(
    model_type="qwen3_omni_moe_thinker", text_config=TEXT, vision_config=VISION, audio_config=AUDIO,
    image_token_id=IDS["<|image_pad|>"], video_token_id=IDS["<|video_pad|>"], audio_token_id=IDS["<|audio_pad|>"],
    vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"],
    audio_start_token_id=IDS["<|audio_start|>"], audio_end_token_id=IDS["<|audio_end|>"], torch_dtype="float32",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["Qwen3OmniMoeForConditionalGeneration"], model_type="qwen3_omni_moe", thinker_config=THINKER,
    talker_config=dict(
        model_type="qwen3_omni_moe_talker", text_config=dict(TEXT, model_type="qwen3_omni_moe_talker_text")
    ),
    enable_audio_output=False, eos_token_id=EOS, torch_dtype="float32",
)  # fmt: skip
#: the image processor (Qwen3-VL's, as the hub's preprocessor_config.json names it) and the audio feature extractor
PREPROCESSOR: dict[str, Any] = dict(
    processor_class="Qwen3OmniMoeProcessor", image_processor_type="Qwen2VLImageProcessor", patch_size=PATCH,
    temporal_patch_size=2, merge_size=MERGE, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    min_pixels=(PATCH * MERGE) ** 2, max_pixels=(PATCH * MERGE * 4) ** 2, do_convert_rgb=True, do_normalize=True,
    do_rescale=True, rescale_factor=1 / 255, feature_extractor_type="WhisperFeatureExtractor", feature_size=128,
    sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400, n_samples=4800000, nb_max_frames=30000,
    padding_side="right", padding_value=0.0, return_attention_mask=True, dither=0.0,
)  # fmt: skip
NAMED = dict(
    image_token="<|image_pad|>", video_token="<|video_pad|>", audio_token="<|audio_pad|>",
    vision_bos_token="<|vision_start|>", vision_eos_token="<|vision_end|>", audio_bos_token="<|audio_start|>",
    audio_eos_token="<|audio_end|>",
)  # fmt: skip

#: mlx-vlm's names for the thinker's parts, and the hub's
PREFIXES = (
    ("thinker.language_model.model.", "thinker.model."),
    ("thinker.language_model.lm_head.", "thinker.lm_head."),
    ("thinker.vision_tower.", "thinker.visual."),
)
MERGER = (("deepstack_merger_list.", "merger_list."), (".norm.", ".ln_q."), (".linear_fc1.", ".mlp.0."),
          (".linear_fc2.", ".mlp.2."))  # fmt: skip


def hub_key(name: str) -> str:
    """A thinker weight as the hub names it."""
    for mine, hub in PREFIXES:
        if name.startswith(mine):
            name = hub + name.removeprefix(mine)
    if name.startswith("thinker.visual.") and "merger" in name:
        for mine, hub in MERGER:
            name = name.replace(mine, hub)
    return name


def build_qwen3_omni_moe(folder: Path) -> Path:
    """A tiny Qwen3-Omni's thinker (see the module's docstring)."""
    settings = dict(processor_class="Qwen3OmniMoeProcessor", extra_special_tokens=NAMED, bos_token=None)
    write_folder(
        folder,
        Family(
            module="qwen3_omni_moe", config=CONFIG, tokens=TOKENS, template=TEMPLATE, eos=EOS, tokenizer=settings,
            processor={"processor_class": "Qwen3OmniMoeProcessor"}, image_processor=PREPROCESSOR, prepend_bos=False,
            hub_key=hub_key,
        ),
    )  # fmt: skip
    return folder


ARCHS: dict[str, Callable[[Path], Path]] = {"qwen3_omni_moe": build_qwen3_omni_moe}
