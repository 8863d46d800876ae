"""A tiny DeepSeek-VL (`multi_modality`, as deepseek-ai/deepseek-vl-1.3b-chat ships it): its SigLIP tower (mlx-vlm's
own image processor pads and resizes every image to 384x384, so the tower reads 576 patches of 16x16: hidden 32, 2
layers), the two-layer `mlp_gelu` aligner and a Llama (hidden 64, 2 layers). mlx-vlm has no processor of its own for
it: it tokenizes the text around the template's `<image>` and writes ONE image token (<image_placeholder>, the
config's image_token_index) in its place, which its `get_input_embeddings` widens to the config's 576
num_image_tokens and fills with the image's features: its embeddings outnumber its prompt's ids (an "expanding"
model, worker/vision_reading.py). The template is DeepSeek-VL's "User: …\\n\\nAssistant:"; <|im_end|> ends an
answer. Keys as the hub's: `vision_model.vision_tower.*`, `aligner.layers.*`, `language_model.model.*`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder

TOKENS = ["<image_placeholder>"]
IDS = added_ids(TOKENS)
SIZE, PATCH = 384, 16
TEXT: dict[str, Any] = dict(
    model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=DEMO_VOCAB + len(TOKENS), rope_theta=10000.0,
    max_position_embeddings=4096,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["MultiModalityCausalLM"], model_type="multi_modality", language_config=TEXT, text_config=TEXT,
    vision_config=dict(
        model_type="vision", cls="SigLIPVisionTower", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, image_size=SIZE, patch_size=PATCH, layer_norm_eps=1e-6,
        params=dict(model_name="siglip_large_patch16_384", image_size=SIZE, select_layer=-1),
    ),
    aligner_config=dict(
        cls="MlpProjector", model_type="aligner",
        params=dict(projector_type="mlp_gelu", depth=2, input_dim=32, n_embed=TEXT["hidden_size"]),
    ),
    image_token_index=IDS["<image_placeholder>"], num_image_tokens=(SIZE // PATCH) ** 2,
    eos_token_id=DEMO_IDS[END], torch_dtype="float32",
)  # fmt: skip
#: DeepSeek-VL's turns ("deepseek" conversation template)
TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + '<|im_end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def build_multi_modality(folder: Path) -> Path:
    """A tiny DeepSeek-VL (see the module's docstring)."""
    return write_folder(
        folder,
        Family(
            module="multi_modality",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=DEMO_IDS[END],
            prepend_bos=False,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"multi_modality": build_multi_modality}
