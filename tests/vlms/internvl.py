"""Tiny InternVL folders (`internvl_chat`: OpenGVLab/InternVL3-1B's layout) that `mlx_vlm.load` reads offline
(tests/tiny_vision.py says how such a folder is built).

An InternViT tower (`intern_vit_6b`: 56x56 tiles, 14x14 patches, hidden 32, 2 layers), the pixel shuffle (0.5) and
`mlp1` projector to 4 image tokens a tile, and a Qwen2 (hidden 64, 2 layers, 4 heads, 2 KV heads, attention bias).
mlx-vlm's InternVLChatProcessor (its own, patched into AutoProcessor) tiles an image into up to 2 tiles by its
aspect ratio, plus a thumbnail when it has more than one (so a wide and a square image give 8 or 12 image tokens),
and writes each image as <img>, 4 <IMG_CONTEXT> a tile, </img>. It renders with ITS OWN chat template (`User: …`,
`Assistant:`), not its tokenizer's (ChatML here, as the hub's): mlx-vlm's `get_chat_template` prefers the
processor's. Added tokens: <img> 2048, </img> 2049, <IMG_CONTEXT> 2050 (image_token_index).

`internvl` is the transformers-native layout (OpenGVLab/InternVL3_5-1B-HF's: `InternVLForConditionalGeneration`): its
InternVL vision tower (56x56 tiles, 14x14 patches, hidden 32, 2 layers, layer scale), the pixel shuffle and
projector, and a Qwen3 text model (hidden 64, 2 layers, q/k norms). mlx-vlm's InternVLProcessor tiles as InternVL
chat's and writes the same <img>, 4 <IMG_CONTEXT> a tile, </img>; the template is ChatML, an image part written
`<IMG_CONTEXT>\n` as the hub's. Keys as mlx-vlm's own (its sanitize maps only those of its converted checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.tiny_kinds import parameters, save_weights, seeded, write_json
from tests.tiny_vision import (
    DEMO_IDS,
    END,
    PAD,
    _added_ids,
    _model_config,
    _torch_conv,
    _write_generation_config,
    _write_tokenizer,
)
from tests.vlms.folder import Family, write_folder

TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>"]
IDS = _added_ids(TOKENS)
SIZE, PATCH = 56, 14
TEXT: dict[str, Any] = dict(
    model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=64, num_hidden_layers=2,
    intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
    vocab_size=2048 + len(TOKENS), max_position_embeddings=4096, rope_theta=1000000.0, attention_bias=True,
    tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="intern_vit_6b", architectures=["InternVisionModel"], hidden_size=32, num_attention_heads=2,
    intermediate_size=64, num_hidden_layers=2, image_size=SIZE, patch_size=PATCH, num_channels=3,
    layer_norm_eps=1e-6, qkv_bias=True, qk_normalization=False, norm_type="layer_norm", drop_path_rate=0.0,
    torch_dtype="float32",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["InternVLChatModel"], model_type="internvl_chat", llm_config=TEXT, vision_config=VISION,
    image_token_index=IDS["<IMG_CONTEXT>"], downsample_ratio=0.5, force_image_size=SIZE, max_dynamic_patch=2,
    min_dynamic_patch=1, use_thumbnail=True, template="internvl2_5", select_layer=-1, ps_version="v2",
    eos_token_id=DEMO_IDS[END], pad_token_id=DEMO_IDS[PAD], tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
#: the hub's tokenizer template (ChatML, as InternVL3's tokenizer_config.json has it): mlx-vlm does not render with it
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}"
    "{{ '<image>\n' }}{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONV = "vision_model.embeddings.patch_embedding.weight"


def build_internvl_chat(folder: Path) -> None:
    """Write a tiny InternVL (see the module's docstring) into `folder`."""
    from mlx_vlm.models import internvl_chat

    folder.mkdir(parents=True, exist_ok=True)
    config = dict(CONFIG, text_config=TEXT)
    weights = parameters(seeded(lambda: internvl_chat.Model(_model_config(internvl_chat, config))))
    weights[CONV] = _torch_conv(weights[CONV])
    save_weights(folder, weights)
    write_json(folder / "config.json", CONFIG)
    _write_generation_config(folder, DEMO_IDS[END])
    _write_tokenizer(folder, TOKENS, dict(processor_class="InternVLChatProcessor"), CHATML, prepend_bos=False)
    (folder / "chat_template.json").unlink()  # (the hub's InternVL3 has its template in tokenizer_config.json)
    write_json(folder / "processor_config.json", dict(processor_class="InternVLChatProcessor"))


HF_TEXT: dict[str, Any] = dict(
    TEXT, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16, attention_bias=False,
    tie_word_embeddings=False,
)  # fmt: skip
HF_CONFIG: dict[str, Any] = dict(
    architectures=["InternVLForConditionalGeneration"], model_type="internvl", text_config=HF_TEXT,
    vision_config=dict(
        model_type="internvl_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, image_size=[SIZE, SIZE], patch_size=[PATCH, PATCH], layer_norm_eps=1e-6,
        layer_scale_init_value=0.1, norm_type="layer_norm", attention_bias=True, use_qk_norm=False,
    ),
    downsample_ratio=0.5, image_token_id=IDS["<IMG_CONTEXT>"], max_dynamic_patch=2, min_dynamic_patch=1,
    use_thumbnail=True, eos_token_id=DEMO_IDS[END], pad_token_id=DEMO_IDS[PAD], torch_dtype="float32",
)  # fmt: skip
#: the HF InternVL template's turns (ChatML), an image part as <IMG_CONTEXT>
HF_TEMPLATE = CHATML.replace("'<image>\n'", "'<IMG_CONTEXT>\n'")


def build_internvl(folder: Path) -> Path:
    """A tiny transformers-native InternVL (see the module's docstring)."""
    return write_folder(
        folder,
        Family(
            module="internvl",
            config=HF_CONFIG,
            tokens=TOKENS,
            template=HF_TEMPLATE,
            eos=DEMO_IDS[END],
            tokenizer=dict(processor_class="InternVLProcessor"),
            processor=dict(processor_class="InternVLProcessor", image_seq_length=4),
            prepend_bos=False,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path | None]] = {"internvl_chat": build_internvl_chat, "internvl": build_internvl}
