"""A tiny Molmo (`molmo`, as allenai/Molmo-7B-D-0924 ships it): its OpenAI-CLIP-style tower (64x64 crops in 8x8
patches, hidden 32, 2 layers, features of its last two layers), attention pooling of 2x2 patches and the MLP
projector, and its Qwen-2-like text model (hidden 64, 2 layers; the image tokens in its additional vocabulary, past
the 2,048 of the demo tokenizer). mlx-vlm's MolmoProcessor places an image's tokens BEFORE the prompt's text
(<im_start>, rows of <im_patch> each ended by <im_col>, <im_end>, for the whole image and its overlapping crops), and
gives the model the patches' places (`image_input_idx`), where the features are added to the tokens' embeddings:
its config names no image token (onelane keys the processor's <im_patch>), its image tokens are ids past the 2,048 it
scores, and the prompt is written once an image (one image a prompt). The template is Molmo's " User: … Assistant:" (an image part renders nothing). Added tokens:
<im_start> 2048, <im_end>, <im_patch>, <im_col>, <|image|>; <|endoftext|> ends an answer, as Qwen's. Keys as the
hub's: `model.transformer.*`, `model.vision_backbone.*`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, Family, added_ids, write_folder

TOKENS = ["<im_start>", "<im_end>", "<im_patch>", "<im_col>", "<|image|>"]
IDS = added_ids(TOKENS)
EOS = DEMO_IDS["<|endoftext|>"]
SIZE, PATCH = 64, 8
TEXT: dict[str, Any] = dict(
    model_type="molmo", max_position_embeddings=1024, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2,
    mlp_ratio=4, max_sequence_length=1024, act_output_multiplier=0.5, mlp_hidden_size=256,
    vocab_size=DEMO_VOCAB, embedding_size=DEMO_VOCAB, additional_vocab_size=128, layer_norm_eps=1e-6,
    rope=True, rope_theta=1000000.0, weight_tying=False, pad_token_id=-1,
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="molmo", image_default_input_size=[SIZE, SIZE], image_patch_size=PATCH,
    image_pos_patch_size=PATCH, hidden_size=128, image_emb_dim=32, image_num_heads=2, image_num_key_value_heads=2,
    image_num_layers=2, image_head_dim=16, image_mlp_dim=64, image_num_pos=(SIZE // PATCH) ** 2 + 1,
    image_norm_eps=1e-5, d_model=64, image_pooling_h=2, image_pooling_w=2, vit_layers=[-1, -2],
    image_pooling_2d="attention-meanq", image_padding_embed="pad_and_partial_pad",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["MolmoForCausalLM"], model_type="molmo", text_config=TEXT, vision_config=VISION,
    image_pooling_h=2, image_pooling_w=2, image_pooling_2d="attention-meanq", image_projector="mlp",
    eos_token_id=EOS, torch_dtype="float32",
)  # fmt: skip
TEMPLATE = (
    "{% for message in messages %}{{ ' ' + message['role'] | capitalize + ': ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ ' Assistant:' }}{% endif %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="MolmoImageProcessor", processor_class="MolmoProcessor", max_crops=2,
    overlap_margins=[2, 2], base_image_input_size=[SIZE, SIZE], image_token_length_w=4, image_token_length_h=4,
    image_patch_size=PATCH, image_padding_mask=True, do_normalize=True,
)  # fmt: skip


def _hub_key(name: str) -> str:
    return name.replace("language_model.model", "model.transformer").replace("vision_tower", "model.vision_backbone")


def build_molmo(folder: Path) -> Path:
    """A tiny Molmo (Molmo-7B-D's layout)."""
    return write_folder(
        folder,
        Family(
            module="molmo",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=EOS,
            tokenizer=dict(bos_token=None, eos_token="<|endoftext|>", processor_class="MolmoProcessor"),
            processor=dict(processor_class="MolmoProcessor"),
            image_processor=IMAGE_PROCESSOR,
            prepend_bos=False,
            hub_key=_hub_key,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"molmo": build_molmo}
