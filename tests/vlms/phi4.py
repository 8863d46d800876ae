"""A tiny Phi-4-multimodal (`phi4mm`, as microsoft/Phi-4-multimodal-instruct ships it, under mlx-vlm's model_type for
it): a SigLIP 2 NaFlex tower (14x14 patches as a linear embedding, hidden 32, 2 layers, its features from the
second-to-last layer, a 4x4 grid of position embeddings resized to each image's patches), the two-layer projector,
the Conformer audio encoder (hidden 32, 1 block: it is built whatever the prompt), and a Phi-4 text model (hidden
64, 2 layers, fused qkv, partial rotary 0.75, untied lm_head). mlx-vlm's Phi4MMProcessor resizes each image to
between 4 and 16 patches (no upscaling past what it needs), and writes its numbered placeholder (<|image_1|>) as ONE
token of id -200 (the config's image_token_index, outside the vocabulary), in place of which `get_input_embeddings`
puts all the image's features: its embeddings outnumber its prompt's ids (an "expanding" model,
worker/vision_reading.py). Without the hub's LoRA weights the text model's are its own for every modality. Added
tokens: <|system|> 2048, <|user|>, <|assistant|>, <|end|> (its answers' end, with <|endoftext|>), <|endoftext11|>
(audio). The template is Phi-4's `<|user|>…<|end|><|assistant|>`. Keys as the hub's: `model.*`, `lm_head.*`,
`model.embed_tokens_extend.image_embed.img_processor.*` (the tower), `….img_projection.*`,
`model.embed_tokens_extend.audio_embed.encoder.*` (its convolutions in torch's layouts).

Phi-4-reasoning-vision (`phi4_siglip`: mlx-vlm's model_type "phi4-siglip", as microsoft/Phi-4-reasoning-vision-15B
ships it) is the same kind of model without audio: a SigLIP 2 NaFlex tower (16x16 patches, hidden 32, 2 layers, a
4x4 grid of position embeddings; transformers' Siglip2ImageProcessor resizes an image to between 4 and 16 patches),
the projector and a Phi-3-style text model (hidden 64, 2 layers); its LlavaProcessor-style processor writes the
template's `<image>` as one token -200, which its config does not name. Its template is Phi-4's ChatML
(`<|im_start|>user<|im_sep|>…<|im_end|>`). Keys as the hub's: `model.*`, `model.vision_tower.*`,
`model.mm_projector.*`, `lm_head.*`. mlx-vlm 0.7.10 reads no image with it here: its processor builds the NaFlex
tower's image processor as transformers' Siglip2ImageProcessor, which in transformers 5 needs torch, and when that
fails AutoProcessor falls back to the bare tokenizer (generate then answers without the image): the builder says
so (Unbuildable) while the processor does not load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, Family, Unbuildable, added_ids, write_folder

TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext11|>"]
IDS = added_ids(TOKENS)
EOS = [IDS["<|end|>"], DEMO_IDS["<|endoftext|>"]]
PATCH = 14
AUDIO: dict[str, Any] = dict(
    attention_dim=32, attention_heads=2, num_blocks=1, linear_units=64, input_size=80, time_reduction=8,
    ext_pw_out_channel=32, depthwise_seperable_out_channel=32, conv_channels=32, kernel_size=3, left_chunk=18,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["Phi4MMForCausalLM"], model_type="phi4mm", hidden_size=64, num_hidden_layers=2,
    intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
    vocab_size=DEMO_VOCAB + len(TOKENS), rope_theta=10000.0, partial_rotary_factor=0.75,
    max_position_embeddings=4096, original_max_position_embeddings=4096, tie_word_embeddings=False,
    mm_hidden_size=32, mm_projector_type="mlp2x_gelu", image_token_index=-200,
    audio_token_index=IDS["<|endoftext11|>"], pad_token_id=DEMO_IDS["<|endoftext|>"], eos_token_id=EOS,
    min_num_patches=4, max_num_patches=16, audio_processor=dict(name="cascades", config=AUDIO),
    vision_config=dict(
        model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_hidden_layers=2, patch_size=PATCH, image_size=4 * PATCH, layer_norm_eps=1e-6,
    ),
    torch_dtype="float32",
)  # fmt: skip
#: Phi-4-multimodal's template
TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message %}"
    "{{ '<|system|>' + message['content'] + '<|end|>' }}{% else %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"
)
EXTEND = "model.embed_tokens_extend."
HUB = {
    "language_model.model.": "model.",
    "language_model.lm_head.": "lm_head.",
    "vision_tower.vision_tower.": EXTEND + "image_embed.img_processor.",
    "mm_projector.": EXTEND + "image_embed.img_projection.",
    "audio_encoder.": EXTEND + "audio_embed.encoder.",
}


def _hub_key(name: str) -> str:
    for mine, hub in HUB.items():
        if name.startswith(mine):
            return hub + name.removeprefix(mine)
    return name


def _torch_conv1d(weights: dict[str, Any]) -> None:
    """The audio encoder's 1-D convolutions in torch's (out, in, k) layout, as the hub stores them (its 2-D ones are
    written in torch's as every 4-D weight is)."""
    for name, weight in weights.items():
        if name.startswith("audio_encoder.") and weight.ndim == 3 and name.endswith("weight"):
            weights[name] = weight.transpose(0, 2, 1)


def build_phi4mm(folder: Path) -> Path:
    """A tiny Phi-4-multimodal (see the module's docstring)."""
    return write_folder(
        folder,
        Family(
            module="phi4mm",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=EOS,
            tokenizer=dict(eos_token="<|endoftext|>", processor_class="Phi4MMProcessor"),
            processor=dict(processor_class="Phi4MMProcessor"),
            prepend_bos=False,
            hub_key=_hub_key,
            weights=_torch_conv1d,
        ),
    )


SIGLIP_TOKENS = ["<|im_sep|>", "<image>"]
SIGLIP_IDS = added_ids(SIGLIP_TOKENS)
SIGLIP_CONFIG: dict[str, Any] = dict(
    architectures=["Phi4ForCausalLMV"], model_type="phi4-siglip", hidden_size=64, num_hidden_layers=2,
    intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
    vocab_size=DEMO_VOCAB + len(SIGLIP_TOKENS), rope_theta=250000.0, partial_rotary_factor=1.0,
    max_position_embeddings=4096, original_max_position_embeddings=4096, mm_hidden_size=32,
    mm_projector_type="mlp2x_gelu", mm_vision_tower="google/siglip2-so400m-patch16-naflex", mm_vision_select_layer=-2,
    min_num_patches=4, max_num_patches=16, eos_token_id=DEMO_IDS["<|im_end|>"],
    pad_token_id=DEMO_IDS["<|endoftext|>"], tie_word_embeddings=False,
    vision_config=dict(
        model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, patch_size=16, num_patches=16, image_size=64, layer_norm_eps=1e-6,
    ),
    torch_dtype="float32",
)  # fmt: skip
SIGLIP_CONFIG["text_config"] = {k: SIGLIP_CONFIG[k] for k in (
    "model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "rms_norm_eps", "vocab_size", "rope_theta", "partial_rotary_factor",
)}  # fmt: skip  # (mlx-vlm reads its text model's sizes there, not at the top as the hub's config has them)
#: Phi-4's ChatML
SIGLIP_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + "
    "'<|im_end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"
)


def _siglip_hub_key(name: str) -> str:
    if name.startswith("language_model."):
        return name.removeprefix("language_model.")
    return "model." + name


def build_phi4_siglip(folder: Path) -> Path:
    """A tiny Phi-4-reasoning-vision (see the module's docstring); Unbuildable while mlx-vlm's processor for it does
    not load."""
    from mlx_vlm.models.phi4_siglip.processing_phi4_siglip import Phi4SigLipProcessor

    built = _build_phi4_siglip(folder)
    try:
        Phi4SigLipProcessor.from_pretrained(str(built))
    except Exception as exc:
        raise Unbuildable(f"its processor does not load ({type(exc).__name__}: {str(exc)[:80]})") from None
    return built


def _build_phi4_siglip(folder: Path) -> Path:
    return write_folder(
        folder,
        Family(
            module="phi4_siglip",
            config=SIGLIP_CONFIG,
            tokens=SIGLIP_TOKENS,
            template=SIGLIP_TEMPLATE,
            eos=DEMO_IDS["<|im_end|>"],
            tokenizer=dict(processor_class="Phi4SigLipProcessor"),
            processor=dict(processor_class="Phi4SigLipProcessor"),
            prepend_bos=False,
            hub_key=_siglip_hub_key,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"phi4mm": build_phi4mm, "phi4_siglip": build_phi4_siglip}
