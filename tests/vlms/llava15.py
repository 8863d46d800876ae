"""A tiny plain LLaVA (`llava`: llava-hf/llava-1.5-7b-hf's layout): tests/vlms/llava.py's CLIP tower, projector and
Llama, one 28x28 image (CLIPImageProcessor: resized on its shortest edge, centre-cropped) written by mlx-vlm's own
LlavaProcessor as its 4 patches' <image> tokens (the CLS feature dropped: `vision_feature_select_strategy`
"default"), one embedding per id. Its template is llava-1.5's "USER: <image>\\n… ASSISTANT:". mlx-vlm 0.7.10 does not
answer it: its LlavaProcessor hands the `padding=True` its prepare_inputs passes on to transformers 5's CLIP image
processor, which rejects it ("unexpected keyword argument 'padding'"), as it would a hub llava-1.5's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, END, Family, write_folder
from tests.vlms.llava import CONFIG, PATCH, SIZE, TOKENS

#: llava-1.5's template (llava-hf/llava-1.5-7b-hf's chat_template.json)
LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<image>\n' }}{% endif %}{% endfor %}"
    "{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] + ' ' }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
LLAVA_IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="CLIPImageProcessor", processor_class="LlavaProcessor", do_convert_rgb=True,
    do_normalize=True, do_rescale=True, do_resize=True, do_center_crop=True, crop_size=dict(height=SIZE, width=SIZE),
    size=dict(shortest_edge=SIZE), image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], resample=3,
    rescale_factor=1 / 255,
)  # fmt: skip


def build_llava(folder: Path) -> Path:
    """A tiny LLaVA 1.5 (see the module's docstring)."""
    config = dict(CONFIG, architectures=["LlavaForConditionalGeneration"], model_type="llava")
    del config["image_grid_pinpoints"]
    processor = dict(
        patch_size=PATCH, vision_feature_select_strategy="default", image_token="<image>",
        num_additional_image_tokens=1, processor_class="LlavaProcessor",
    )  # fmt: skip
    return write_folder(
        folder,
        Family(
            module="llava",
            config=config,
            tokens=TOKENS,
            template=LLAVA_TEMPLATE,
            eos=DEMO_IDS[END],
            tokenizer=dict(image_token="<image>", processor_class="LlavaProcessor"),
            processor=processor,
            image_processor=LLAVA_IMAGE_PROCESSOR,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"llava": build_llava}
