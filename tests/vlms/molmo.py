"""A tiny Molmo (`molmo`, as allenai/Molmo-7B-D-0924 ships it): its OpenAI-CLIP-style tower (64x64 crops in 8x8
patches, hidden 32, 2 layers, features of its last two layers), attention pooling of 2x2 patches and the MLP
projector, and its Qwen-2-like text model (hidden 64, 2 layers; the image tokens in its additional vocabulary, past
the 2,048 of the demo tokenizer). mlx-vlm's MolmoProcessor places an image's tokens BEFORE the prompt's text
(<im_start>, rows of <im_patch> each ended by <im_col>, <im_end>, for the whole image and its overlapping crops), and
gives the model the patches' places (`image_input_idx`), where the features are added to the tokens' embeddings:
its config names no image token (onelane names the span of those places: worker/vision_reading.py), its image tokens
are ids past the 2,048 it scores, and the prompt is written once an image (one image a prompt). The template is
Molmo's " User: … Assistant:" (an image part renders nothing). Added tokens:
<im_start> 2048, <im_end>, <im_patch>, <im_col>, <|image|>; <|endoftext|> ends an answer, as Qwen's. Keys as the
hub's: `model.transformer.*`, `model.vision_backbone.*`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder

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


#: Molmo 2 (`molmo2`, as allenai/Molmo2-8B ships it): a SigLIP-like tower (378x378 crops in 14x14 patches, as mlx-vlm's
#: image processor makes them whatever its config says; hidden 32, 2 layers, features of its last two layers),
#: attention pooling of 2x2 patches and the SwiGLU projector, and a Qwen-3-like text model (hidden 64, 2 layers, QK
#: norm); its image tokens are ids of its additional vocabulary, past the 2,048 it scores. Its processor expands the
#: template's <|image|> into the low-resolution crop's rows (<low_res_im_start>, rows of <im_patch> each ended by
#: <im_col>, <im_end>) then the overlapping crops'; the features are added to the <im_patch> embeddings in order (its
#: config's `image_patch_id`, onelane's image token). The template is ChatML's, an image part rendering <|image|>.
TOKENS2 = [
    "<im_start>", "<im_end>", "<im_patch>", "<im_col>", "<low_res_im_start>", "<im_low>", "<frame_start>",
    "<frame_end>", "<|image|>",
]  # fmt: skip
IDS2 = added_ids(TOKENS2)
TEXT2: dict[str, Any] = dict(
    model_type="molmo2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=DEMO_VOCAB, additional_vocab_size=128,
    max_position_embeddings=1024, rope_theta=1000000.0, use_qk_norm=True, layer_norm_eps=1e-6,
)  # fmt: skip
VISION2: dict[str, Any] = dict(
    vit_config=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        head_dim=16, image_patch_size=14, image_num_pos=27 * 27, image_default_input_size=[378, 378],
    ),
    adapter_config=dict(
        hidden_size=32, intermediate_size=128, text_hidden_size=64, num_attention_heads=2, num_key_value_heads=2,
        head_dim=16, vit_layers=[-1, -2],
    ),
)  # fmt: skip
CONFIG2: dict[str, Any] = dict(
    architectures=["Molmo2ForConditionalGeneration"], model_type="molmo2", text_config=TEXT2,
    vision_config=VISION2, image_start_token_id=IDS2["<im_start>"],
    low_res_image_start_token_id=IDS2["<low_res_im_start>"], image_end_token_id=IDS2["<im_end>"],
    image_low_res_id=IDS2["<im_low>"], image_patch_id=IDS2["<im_patch>"], image_col_id=IDS2["<im_col>"],
    frame_start_token_id=IDS2["<frame_start>"], frame_end_token_id=IDS2["<frame_end>"],
    eos_token_id=[DEMO_IDS[END]], tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
TEMPLATE2 = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}<|image|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _hub_key2(name: str) -> str:
    name = name.replace("language_model.model.", "model.transformer.").replace("language_model.lm_head", "lm_head")
    name = name.replace("vision_tower.", "model.vision_backbone.")
    return name.replace(".image_vit.transformer.", ".image_vit.transformer.resblocks.")


def build_molmo2(folder: Path) -> Path:
    """A tiny Molmo 2 (Molmo2-8B's layout)."""
    return write_folder(
        folder,
        Family(
            module="molmo2",
            config=CONFIG2,
            tokens=TOKENS2,
            template=TEMPLATE2,
            eos=DEMO_IDS[END],
            tokenizer=dict(bos_token=None, eos_token=END, processor_class="Molmo2Processor"),
            processor=dict(processor_class="Molmo2Processor"),
            image_processor=dict(
                image_processor_type="Molmo2ImageProcessor",
                processor_class="Molmo2Processor",
                size={"height": 378, "width": 378},
                max_crops=8,
                overlap_margins=[4, 4],
                patch_size=14,
                pooling_size=[2, 2],
            ),
            prepend_bos=False,
            hub_key=_hub_key2,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"molmo": build_molmo, "molmo2": build_molmo2}
