"""Tiny random-weight vision-language model folders that `mlx_vlm.load` reads as it reads a hub checkpoint.

Built offline in the spirit of tests/tiny_kinds.py: a small config, the mlx-vlm class's own initialisation under a
fixed seed, float32, the keys the hub checkpoint has (mlx-vlm's `sanitize` maps them back: the patch embedding's
convolution is stored in torch's (out, in, kh, kw) layout, a tied lm_head is left out), and the demo model's
tokenizer (worker/demo: a 2,048-token byte-level BPE whose special tokens are <|endoftext|> 0, <|im_start|> 1,
<|im_end|> 2) with the special tokens each architecture's processor needs ADDED after its vocabulary (ids 2048 on,
the text model's vocab_size exactly the tokenizer's length). Every folder also has what its hub repository has for
the processor: preprocessor_config.json (the image processor), processor_config.json, chat_template.json (the
template is in tokenizer_config.json too) and generation_config.json (greedy: do_sample false). So
`mlx_vlm.load(folder)` builds the model and, through AutoProcessor, mlx-vlm's own processor class with the
transformers image processor (the PIL one: no torch here), and `mlx_vlm.generate(model, processor, prompt,
image=[...])` answers offline, greedily the same on every run and build (the folders are byte-identical), and
differently for a red and a blue image. Both models have ordinary 1-D positions (no mRoPE).

- `build_gemma3(folder)`: Gemma 3 as google/gemma-3-4b-it ships it (`Gemma3ForConditionalGeneration`, model_type
  "gemma3", 359 k parameters): a SigLIP tower (32x32 images, 8x8 patches, hidden 32, 2 layers), the projector
  average-pooling its 4x4 patches to mm_tokens_per_image = 4 soft tokens, and a Gemma 3 text model (hidden 64, 2
  layers, 4 query heads and 1 KV head of 16, sliding window 16 with sliding_window_pattern 2: layer 0 slides, with a
  RotatingKVCache, layer 1 is global, with a KVCache). Added tokens: <start_of_turn> 2048, <end_of_turn> 2049,
  <start_of_image> 2050 (boi_token_index), <end_of_image> 2051 (eoi_token_index), <image_soft_token> 2052
  (image_token_index); eos ids [<|im_end|> 2, <end_of_turn> 2049]; pad 0 (Gemma 3's merge zeroes pad positions).
  The tokenizer prepends <|im_start|> as Gemma's prepends <bos>, and the chat template is Gemma 3's, starting with
  bos_token: `{"type": "image"}` renders <start_of_image>, which the processor expands to two newlines, boi, the 4
  soft tokens, eoi, two newlines. mlx-vlm initialises `mm_input_projection_weight` to ones (a placeholder for the
  checkpoint's), which would give every soft token the same direction: it is drawn from a seeded normal instead.
  config.json has a top-level hidden_size (the text model's): mlx-vlm divides the image features by its square root
  (2048 when absent, as in hub configs) before the text model multiplies every input embedding by sqrt(64).
  `build_gemma3(folder, **sizes)` builds it bigger (a benchmark's model: bench/vision.py), same layout and seed.
- `build_idefics3(folder)`: SmolVLM as HuggingFaceTB/SmolVLM-256M-Instruct ships it (Idefics 3:
  `Idefics3ForConditionalGeneration`, model_type "idefics3", 369 k parameters, keys `model.vision_model.*`,
  `model.connector.*`, `model.text_model.*`, `lm_head.weight`): a SigLIP-style tower (32x32 images, no splitting
  into tiles, 8x8 patches, hidden 32, 2 layers), the connector's pixel shuffle (scale_factor 2) and linear
  projection to 4 image tokens, and a Llama (hidden 64, 2 layers, 4 heads, 2 KV heads, untied lm_head, plain
  KVCaches). Added tokens: <fake_token_around_image> 2048, <image> 2049 (image_token_id), <end_of_utterance> 2050
  (eos), <global-img> 2051. SmolLM's tokenizer has the demo one's special tokens and adds no BOS: the chat template
  (SmolVLM's) starts with <|im_start|> and renders "User:<image>What is this?<end_of_utterance>", a newline,
  "Assistant:"; the processor expands <image> to <fake_token_around_image>, <global-img>, 4 <image>,
  <fake_token_around_image>.

mlx-vlm 0.7.10's processors (its own Gemma3Processor and Idefics3Processor, patched into AutoProcessor) give the
template to their tokenizer only, so `processor.apply_chat_template` raises ("this processor does not have a chat
template"), as it does for the hub checkpoints: render with `processor.tokenizer.apply_chat_template`. With no
template on the processor, mlx-vlm tokenizes the rendered prompt with add_special_tokens=True, so a Gemma 3 prompt
starts with two BOS, as a hub Gemma 3's would. LLaVA is not built: mlx-vlm 0.7.10's LlavaProcessor hands the
`padding=True` its prepare_inputs passes to transformers 5's CLIP image processor, which rejects it ("unexpected
keyword argument 'padding'"), so no llava folder generates with an image here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from tasks.catalogue import SHIPPED_DEMO_MODEL
from tests.tiny_kinds import parameters, save_weights, seeded, write_json

DEMO_VOCAB = 2048  # the demo tokenizer's
SEED = 11
MAX_LENGTH = 1024  # the tokenizers' model_max_length
PAD, START, END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"  # ids 0, 1, 2 in the demo vocabulary
DEMO_IDS = {PAD: 0, START: 1, END: 2}
BOS = START  # Gemma 3's tokenizer prepends it as Gemma's prepends <bos>; SmolVLM's template starts with it


def _added_ids(tokens: list[str]) -> dict[str, int]:
    return {token: DEMO_VOCAB + i for i, token in enumerate(tokens)}


# ---- Gemma 3
GEMMA3_TOKENS = ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
GEMMA3_IDS = _added_ids(GEMMA3_TOKENS)
GEMMA3_IMAGE_SIZE, GEMMA3_PATCH, GEMMA3_IMAGE_TOKENS = 32, 8, 4
GEMMA3_CONTEXT = 32 * MAX_LENGTH  # its context: the stories' long streams beside image work fit in it
GEMMA3_TEXT: dict[str, Any] = dict(
    model_type="gemma3_text", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, rms_norm_eps=1e-6,
    vocab_size=DEMO_VOCAB + len(GEMMA3_TOKENS), sliding_window=16, sliding_window_pattern=2,
    rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None, max_position_embeddings=GEMMA3_CONTEXT,
    mm_tokens_per_image=GEMMA3_IMAGE_TOKENS, hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
    attn_logit_softcapping=None, attention_bias=False, attention_dropout=0.0, torch_dtype="float32",
)  # fmt: skip
GEMMA3_VISION: dict[str, Any] = dict(
    model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, image_size=GEMMA3_IMAGE_SIZE, patch_size=GEMMA3_PATCH, num_channels=3,
    layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh", vision_use_head=False, torch_dtype="float32",
)  # fmt: skip
GEMMA3_EOS = [DEMO_IDS[END], GEMMA3_IDS["<end_of_turn>"]]
GEMMA3: dict[str, Any] = dict(
    architectures=["Gemma3ForConditionalGeneration"], model_type="gemma3", text_config=GEMMA3_TEXT,
    vision_config=GEMMA3_VISION, mm_tokens_per_image=GEMMA3_IMAGE_TOKENS, hidden_size=GEMMA3_TEXT["hidden_size"],
    boi_token_index=GEMMA3_IDS["<start_of_image>"], eoi_token_index=GEMMA3_IDS["<end_of_image>"],
    image_token_index=GEMMA3_IDS["<image_soft_token>"], pad_token_id=DEMO_IDS[PAD], bos_token_id=DEMO_IDS[BOS],
    eos_token_id=GEMMA3_EOS, initializer_range=0.02, tie_word_embeddings=True, torch_dtype="float32",
)  # fmt: skip
#: Gemma 3's own template (google/gemma-3-*-it), with its <bos> the tokenizer's bos_token
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}{{ raise_exception('Invalid content type') }}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
GEMMA3_IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="Gemma3ImageProcessor", processor_class="Gemma3Processor", do_convert_rgb=None,
    do_normalize=True, do_pan_and_scan=None, do_rescale=True, do_resize=True, image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5], image_seq_length=GEMMA3_IMAGE_TOKENS, pan_and_scan_max_num_crops=None,
    pan_and_scan_min_crop_size=None, pan_and_scan_min_ratio_to_activate=None, resample=2, rescale_factor=1 / 255,
    size=dict(height=GEMMA3_IMAGE_SIZE, width=GEMMA3_IMAGE_SIZE),
)  # fmt: skip
GEMMA3_NAMED = dict(boi_token="<start_of_image>", eoi_token="<end_of_image>", image_token="<image_soft_token>")

# ---- SmolVLM (Idefics 3)
IDEFICS3_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
IDEFICS3_IDS = _added_ids(IDEFICS3_TOKENS)
IDEFICS3_IMAGE_SIZE, IDEFICS3_PATCH, IDEFICS3_SHUFFLE = 32, 8, 2
IDEFICS3_IMAGE_TOKENS = (IDEFICS3_IMAGE_SIZE // IDEFICS3_PATCH // IDEFICS3_SHUFFLE) ** 2
IDEFICS3_EOS = IDEFICS3_IDS["<end_of_utterance>"]
IDEFICS3_TEXT: dict[str, Any] = dict(
    model_type="llama", architectures=["VLlama3ForCausalLM"], hidden_size=64, num_hidden_layers=2,
    intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
    vocab_size=DEMO_VOCAB + len(IDEFICS3_TOKENS), rope_theta=100000.0, max_position_embeddings=MAX_LENGTH,
    tie_word_embeddings=False, hidden_act="silu", pad_token_id=DEMO_IDS[PAD], torch_dtype="float32",
)  # fmt: skip
IDEFICS3_VISION: dict[str, Any] = dict(
    model_type="idefics3_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    image_size=IDEFICS3_IMAGE_SIZE, patch_size=IDEFICS3_PATCH, num_channels=3, layer_norm_eps=1e-6,
    hidden_act="gelu_pytorch_tanh", max_image_size=dict(longest_edge=IDEFICS3_IMAGE_SIZE), torch_dtype="float32",
)  # fmt: skip
IDEFICS3: dict[str, Any] = dict(
    architectures=["Idefics3ForConditionalGeneration"], model_type="idefics3", text_config=IDEFICS3_TEXT,
    vision_config=IDEFICS3_VISION, scale_factor=IDEFICS3_SHUFFLE, image_token_id=IDEFICS3_IDS["<image>"],
    vocab_size=IDEFICS3_TEXT["vocab_size"], pad_token_id=DEMO_IDS[PAD], bos_token_id=DEMO_IDS[START],
    eos_token_id=IDEFICS3_EOS, tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
#: SmolVLM's template (HuggingFaceTB/SmolVLM-*-Instruct), also taking a message's content as a plain string
IDEFICS3_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}"
    "{% else %}{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
IDEFICS3_IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="Idefics3ImageProcessor", processor_class="Idefics3Processor", do_convert_rgb=True,
    do_image_splitting=False, do_normalize=True, do_pad=True, do_rescale=True, do_resize=True,
    image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], max_image_size=dict(longest_edge=IDEFICS3_IMAGE_SIZE),
    resample=1, rescale_factor=1 / 255, size=dict(longest_edge=IDEFICS3_IMAGE_SIZE),
)  # fmt: skip

GEMMA3_CONV = "vision_tower.vision_model.embeddings.patch_embedding.weight"
GEMMA3_PROJECTION = "multi_modal_projector.mm_input_projection_weight"
IDEFICS3_CONV = "vision_model.embeddings.patch_embedding.weight"


def build_gemma3(folder: Path, **sizes: Any) -> Path:
    """Write a tiny Gemma 3 vision-language model (the layout of google/gemma-3-4b-it) into `folder`; returns it.
    `sizes` make it bigger (a benchmark's model; none: the tiny one, byte for byte): see gemma3_sizes."""
    import mlx.core as mx
    from mlx_vlm.models import gemma3

    config, image_processor = gemma3_sizes(**sizes)
    image_tokens = config["mm_tokens_per_image"]
    folder.mkdir(parents=True, exist_ok=True)
    weights = parameters(seeded(lambda: gemma3.Model(_model_config(gemma3, config))))
    del weights["language_model.lm_head.weight"]  # tied: the checkpoint has none, sanitize copies embed_tokens
    shape = weights[GEMMA3_PROJECTION].shape  # (vision hidden, text hidden), initialised to ones
    weights[GEMMA3_PROJECTION] = mx.random.normal(shape, key=mx.random.key(SEED)) * shape[0] ** -0.5
    weights[GEMMA3_CONV] = _torch_conv(weights[GEMMA3_CONV])
    save_weights(folder, weights)
    write_json(folder / "config.json", config)
    _write_generation_config(folder, GEMMA3_EOS)
    named = dict(GEMMA3_NAMED, extra_special_tokens=GEMMA3_NAMED, processor_class="Gemma3Processor")
    _write_tokenizer(folder, GEMMA3_TOKENS, named, GEMMA3_CHAT_TEMPLATE)
    processor = dict(image_seq_length=image_tokens, processor_class="Gemma3Processor")
    write_json(folder / "processor_config.json", processor)
    write_json(folder / "preprocessor_config.json", image_processor)
    return folder


#: what build_gemma3's `sizes` may set: the text model's sizes as its config names them, the vision tower's with a
#: `vision_` prefix, and mm_tokens_per_image (the soft tokens an image becomes)
GEMMA3_TEXT_SIZES = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "sliding_window", "sliding_window_pattern")  # fmt: skip
GEMMA3_VISION_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
                       "patch_size")  # fmt: skip


def gemma3_sizes(**sizes: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Gemma 3's config.json and preprocessor_config.json with `sizes` over GEMMA3's (none: GEMMA3 and
    GEMMA3_IMAGE_PROCESSOR themselves): e.g. `hidden_size=256, head_dim=64, vision_image_size=224,
    vision_patch_size=14, mm_tokens_per_image=64`. query_pre_attn_scalar follows head_dim, the top-level hidden_size
    the text model's, the image processor's size the tower's image_size. The projector average-pools the tower's
    (image_size / patch_size)^2 patches to mm_tokens_per_image, so that must be a square whose side divides theirs."""
    if not sizes:
        return GEMMA3, GEMMA3_IMAGE_PROCESSOR
    text = {k: sizes.pop(k) for k in GEMMA3_TEXT_SIZES if k in sizes}
    vision = {k: sizes.pop(f"vision_{k}") for k in GEMMA3_VISION_SIZES if f"vision_{k}" in sizes}
    image_tokens = int(sizes.pop("mm_tokens_per_image", GEMMA3_IMAGE_TOKENS))
    if sizes:
        raise ValueError(
            f"unknown Gemma 3 sizes {sorted(sizes)}: text {GEMMA3_TEXT_SIZES}, vision_* {GEMMA3_VISION_SIZES}, "
            "mm_tokens_per_image"
        )
    if "head_dim" in text:
        text["query_pre_attn_scalar"] = text["head_dim"]
    text_config = dict(GEMMA3_TEXT, **text, mm_tokens_per_image=image_tokens)
    vision_config = dict(GEMMA3_VISION, **vision)
    size, patch = vision_config["image_size"], vision_config["patch_size"]
    side = round(image_tokens**0.5)
    if size % patch or side * side != image_tokens or (size // patch) % side:
        raise ValueError(
            f"image_size {size}, patch_size {patch}: {(size // patch) ** 2} patches do not pool to "
            f"mm_tokens_per_image {image_tokens} (a square whose side divides {size // patch})"
        )
    config = dict(GEMMA3, text_config=text_config, vision_config=vision_config, hidden_size=text_config["hidden_size"])
    config["mm_tokens_per_image"] = image_tokens
    image_processor = dict(GEMMA3_IMAGE_PROCESSOR, image_seq_length=image_tokens, size=dict(height=size, width=size))
    return config, image_processor


def build_idefics3(folder: Path) -> Path:
    """Write a tiny SmolVLM (Idefics 3: the layout of HuggingFaceTB/SmolVLM-256M-Instruct) into `folder`; returns it."""
    from mlx_vlm.models import idefics3

    folder.mkdir(parents=True, exist_ok=True)
    weights = parameters(seeded(lambda: idefics3.Model(_model_config(idefics3, IDEFICS3))))
    weights[IDEFICS3_CONV] = _torch_conv(weights[IDEFICS3_CONV])
    weights = {_idefics3_hub_key(name): weight for name, weight in weights.items()}
    save_weights(folder, weights)
    write_json(folder / "config.json", IDEFICS3)
    _write_generation_config(folder, IDEFICS3_EOS)
    settings = dict(bos_token=START, eos_token="<end_of_utterance>", processor_class="Idefics3Processor")
    _write_tokenizer(folder, IDEFICS3_TOKENS, settings, IDEFICS3_CHAT_TEMPLATE, prepend_bos=False)
    processor = dict(image_seq_len=IDEFICS3_IMAGE_TOKENS, processor_class="Idefics3Processor")
    write_json(folder / "processor_config.json", processor)
    write_json(folder / "preprocessor_config.json", IDEFICS3_IMAGE_PROCESSOR)
    return folder


def _idefics3_hub_key(name: str) -> str:
    """Idefics3ForConditionalGeneration's key of an mlx-vlm parameter: model.vision_model.*, model.connector.*,
    model.text_model.*, lm_head.weight."""
    if name == "language_model.lm_head.weight":
        return "lm_head.weight"
    if name.startswith("language_model."):
        return "model.text_model." + name.removeprefix("language_model.")
    return "model." + name


#: every builder, by mlx-vlm model_type
BUILDERS: dict[str, Callable[[Path], Path]] = {"gemma3": build_gemma3, "idefics3": build_idefics3}


def _model_config(module: ModuleType, config: dict[str, Any]) -> Any:
    """`module`'s ModelConfig of `config`, with its text and vision configs, as mlx-vlm's load_model makes it."""
    from mlx_vlm.utils import update_module_configs

    return update_module_configs(module.ModelConfig.from_dict(config), module, config, ["text", "vision"])


def _torch_conv(weight: Any) -> Any:
    """An MLX (out, kh, kw, in) convolution kernel in torch's (out, in, kh, kw) layout, as the hub stores it."""
    return weight.transpose(0, 3, 1, 2)


def _write_generation_config(folder: Path, eos: int | list[int]) -> None:
    """Greedy by default (do_sample false): mlx-vlm takes its sampling defaults from this file."""
    config = dict(bos_token_id=DEMO_IDS[BOS], eos_token_id=eos, pad_token_id=DEMO_IDS[PAD], do_sample=False)
    write_json(folder / "generation_config.json", config)


def _write_tokenizer(
    folder: Path, added: list[str], settings: dict[str, Any], chat_template: str, prepend_bos: bool = True
) -> None:
    """The demo tokenizer with the special tokens `added` after its vocabulary, BOS (<|im_start|>) prepended to
    every text if `prepend_bos`, `settings` (named tokens, eos, ...) over its tokenizer_config, and `chat_template`
    there and in chat_template.json."""
    tokenizer = json.loads((SHIPPED_DEMO_MODEL / "tokenizer.json").read_text())
    for token_id, token in enumerate(added, start=DEMO_VOCAB):
        entry = dict(id=token_id, content=token, single_word=False, lstrip=False, rstrip=False, normalized=False)
        tokenizer["added_tokens"].append(dict(entry, special=True))
    if prepend_bos:
        bos = {"SpecialToken": {"id": BOS, "type_id": 0}}
        tokenizer["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [DEMO_IDS[BOS]], "tokens": [BOS]}},
        }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    config = json.loads((SHIPPED_DEMO_MODEL / "tokenizer_config.json").read_text())
    config.update(bos_token=BOS, eos_token=END, pad_token=PAD, add_bos_token=prepend_bos)
    config.update(settings, model_max_length=MAX_LENGTH, chat_template=chat_template)
    write_json(folder / "tokenizer_config.json", config)
    write_json(folder / "chat_template.json", {"chat_template": chat_template})
