"""A tiny MiMo-V2 (`mimo_v2`, as XiaomiMiMo's MiMo-V2 omni checkpoints ship it): its vision tower (16x16 patches,
temporal patches of 2, merged 2x2; hidden 32, 2 layers), an audio encoder it builds whether or not a prompt has sound
(tiny here), and its text model (hidden 64, 2 layers: the first sliding-window attention with sink biases, the second
full attention with a mixture of 2 experts). Its config is flat (the text model's settings at the top). Its processor
is Qwen2.5-VL's: <|vision_start|><|image_pad|><|vision_end|>, one <|image_pad|> per 2x2 patches; tokens and template
Qwen2.5-VL's (tests/vlms/qwen.py). Keys as mlx-vlm names them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import Family, write_folder
from tests.vlms.qwen import EOS, IDS, IMAGE_PROCESSOR, TEMPLATE, TEXT, TOKENS

PATCH = 16
CONFIG: dict[str, Any] = dict(
    architectures=["MiMoV2ForConditionalGeneration"], model_type="mimo_v2", vocab_size=TEXT["vocab_size"],
    hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, v_head_dim=16, swa_head_dim=16, swa_v_head_dim=16,
    swa_num_attention_heads=4, swa_num_key_value_heads=2, max_position_embeddings=4096, sliding_window_size=16,
    hybrid_layer_pattern=[1, 0], moe_layer_freq=[0, 1], n_routed_experts=2, num_experts_per_tok=1,
    partial_rotary_factor=0.5,
    vision_config=dict(
        model_type="mimovl", depth=2, hidden_size=32, intermediate_size=64, out_hidden_size=64, num_heads=2,
        num_key_value_heads=2, num_query_groups=2, qk_channels=16, patch_size=PATCH, spatial_patch_size=PATCH,
        window_size=64, visual_token_window_size=16, fullatt_block_indexes=[1],
    ),
    audio_config=dict(
        out_hidden_size=64, input_local_attn_heads=2, input_local_dim=32, input_local_head_dim=16,
        input_local_intermediate_size=64, input_local_layers=1,
    ),
    image_token_id=IDS["<|image_pad|>"], video_token_id=IDS["<|video_pad|>"],
    vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"], eos_token_id=EOS,
    torch_dtype="float32",
)  # fmt: skip


def build_mimo_v2(folder: Path) -> Path:
    """A tiny MiMo-V2."""
    return write_folder(
        folder,
        Family(
            module="mimo_v2",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=EOS,
            tokenizer=dict(
                processor_class="MiMoV2Processor",
                image_token="<|image_pad|>",
                video_token="<|video_pad|>",
                bos_token=None,
            ),
            processor=dict(processor_class="MiMoV2Processor"),
            image_processor=dict(
                IMAGE_PROCESSOR,
                patch_size=PATCH,
                min_pixels=(PATCH * 2) ** 2,
                max_pixels=(PATCH * 2 * 4) ** 2,
                processor_class="MiMoV2Processor",
            ),
            prepend_bos=False,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"mimo_v2": build_mimo_v2}
