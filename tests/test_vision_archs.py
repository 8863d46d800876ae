"""Every vision architecture of the corpus (tests/vlms/), served as mlx-vlm answers (issue 61): three image prompts
of different lengths (each its own PNG: a solid colour, a checkerboard, a gradient, of different sizes; questions of
different lengths) put into onelane's batch at once, greedy, each answer compared token for token with
`mlx_vlm.generate`'s for that prompt and image alone.

Each architecture's tiny folder is loaded as the worker loads it (worker/vision.py `VisionEngine.load`, max_batch 4,
then the batching trial the worker runs before a model's first job: worker/batch/sharing.py), driven directly, not
through the web, for speed; one architecture new in the corpus also goes through the whole stack (the worker, the
web, the openai SDK). The table (architecture, how its sequences share the batch, served or refused, equal or not)
is printed (`-s`) and is the failure's message: the test fails if any architecture does worse than EXPECTED says,
and the printed table asks for EXPECTED to be raised where one does better. Run it with

    .venv/bin/python -m pytest -n 0 -s tests/test_vision_archs.py
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tasks.settings import Settings
from tests import vlms
from tests.test_hostile_models import serve
from tests.vlms.folder import Unbuildable

# (a guard against a hang, not a bound: 82-105 s quiet; beside the hog on a fresh machine, its MLX kernels compiled
# on first use, 493 s of 600 on 2026-12-07)
pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow_file]

MAX_TOKENS = 12
PREFILL_STEP = 8  # small, so an image prompt is read in several chunks beside the others' steps

#: what each architecture does today: "batched equal" (its image prompts share the batch and answer as mlx-vlm
#: alone), "alone equal" (they run one at a time, answering as mlx-vlm), "served differs" (answered, not as mlx-vlm),
#: "served fails" (loaded, but its image prompts fail), "refused" (the model fails its load), "mlx-vlm fails: <why>"
#: (mlx-vlm itself cannot build or answer it: not counted)
EXPECTED: dict[str, str] = {
    "aya_vision": "batched equal",
    "deepseek_vl_v2": "served differs",  # mlx-vlm's own answers for it differ from one process to the next
    "fastvlm": "mlx-vlm fails: no tiny config builds",
    "gemma3": "batched equal",
    "gemma4": "batched equal",  # its per-layer inputs carried beside its embeddings (worker/vision_beside.py)
    "granite_vision": "batched equal",  # its embeddings outnumber its prompt's ids, as LLaVA-NeXT's
    "idefics2": "batched equal",
    "idefics3": "batched equal",
    "kimi_vl": "batched equal",
    "lfm2_vl": "batched equal",
    "llama4": "alone equal",  # mlx-lm cannot merge its chunked attention's caches
    "llava_onevision": "batched equal",
    "molmo": "batched equal",  # its features go where its processor says (image_input_idx): that span named
    "mistral3": "batched equal",
    "moondream2": "mlx-vlm fails: its processor loads its tokenizer from the hub",
    "moondream3": "mlx-vlm fails: its processor loads its tokenizer from the hub",
    "paddleocr_vl": "batched equal",  # M-RoPE, as Qwen2-VL's: each row's own positions (worker/batch/positions.py)
    "phi3_v": "mlx-vlm fails: no tiny config builds",
    "pixtral": "batched equal",
    "smolvlm": "batched equal",
}
# the other families' modules (tests/vlms/qwen.py, glm.py, llava.py, internvl.py, paligemma.py, mllama.py), as issue 61
# found them on this worker (untried ones as their kin): raised as each is served right
EXPECTED |= {
    # M-RoPE: each row carries its own positions (worker/batch/positions.py), Qwen3-VL its deepstack features
    "qwen2_vl": "batched equal",
    "qwen2_5_vl": "batched equal",
    "qwen3_vl": "batched equal",
    "qwen3_vl_moe": "batched equal",
    "qwen3_5": "batched equal",
    "glm4v": "batched equal",
    "llava_next": "batched equal",  # more embeddings than prompt ids: as many positions in its keyed prompt
    "internvl_chat": "batched equal",  # rendered with its processor's own template, as mlx-vlm renders it
    "paligemma": "alone equal",  # its image prompt read whole (a prefix read both ways); its decode alone
    "mllama": "alone equal",  # cross-attention states at every step: its image jobs run alone
}
# group A (issue 61's second round: tests/vlms/gemma3n.py, phi4.py, minicpm.py, jina.py, granite.py, llava15.py,
# bunny.py, internvl.py, deepseek_vl.py, llmjp.py, plamo.py; Florence-2, a task model, is left out)
EXPECTED |= {
    "gemma3n": "mlx-vlm fails: its MobileNetV5 tower is a constant of the code (~300 M parameters)",
    "granite4_vision": "batched equal",  # its deepstack features by the prompt's positions (worker/vision_beside.py)
    "internvl": "batched equal",
    "jina_vlm": "batched equal",  # as Molmo: its features go where its processor says (image_input_idx)
    "llava": "mlx-vlm fails: its LlavaProcessor hands padding=True to transformers 5's CLIP image processor",
    "llava_bunny": "batched equal",  # one token (-200) an image, 729 embeddings; its processor its tokenizer
    "llmjpvl": "mlx-vlm fails: mlx-vlm has no processor for it (the hub's is remote code)",
    # its features go where its processor says (image_bound: each image's and slice's span); M-RoPE over text positions
    "minicpmv4_6": "batched equal",
    "minicpmo": "batched equal",  # as MiniCPM-V 4.6 (an image-only folder: no audio tower, no TTS)
    "multi_modality": "batched equal",  # one image token, widened to 576 embeddings by its model
    "phi4mm": "batched equal",  # one token (-200) an image, its embeddings more: as LLaVA-NeXT's
    "phi4_siglip": "mlx-vlm fails: its processor does not load (its NaFlex image processor needs torch)",
    "plamo2vl": "batched equal",  # its tokenizer mlx-vlm's own code: its processor's, wrapped as mlx-lm wraps one
}
# group B: the MoE Qwen and GLM kin, the OCR models and the other M-RoPE families (tests/vlms/qwen_moe.py, ...)
EXPECTED |= {
    "qwen3_5_moe": "batched equal",
    "glm4v_moe": "batched equal",
    "glm_ocr": "batched equal",
    "ernie4_5_moe_vl": "batched equal",  # its positions (B, L, 3), turned from the batch's (3, B, L) as it reads them
    "dots_ocr": "batched equal",
    # XD-RoPE only in a cache's first pass: its image prompts read whole; decoding rotates by the batched cache's
    # shared offset, not each row's (the batching trial finds it 0.29 nats off): its sequences run alone
    "hunyuan_vl": "alone equal",
    "deepseekocr": "mlx-vlm fails: its SAM image encoder is SAM ViT-B (12 layers of 768, 1,024-pixel images) "
    "whatever the config says",
    "deepseekocr_2": "mlx-vlm fails: its SAM image encoder is SAM ViT-B (12 layers of 768, 1,024-pixel images) "
    "whatever the config says",
    # its batched caches fail (mlx-vlm's CacheList.extract over an indexer cache still empty): its sequences run alone
    "glm5_next": "alone equal",
    "got": "batched equal",  # its image token named im_patch_token; no chat template (its processor writes the turns)
    # its sparse attention's indexer picks keys once a sequence holds more than its budget; mlx-vlm's batched decode
    # step, its rows of different lengths, attends to every key (text and image prompts alike): the worker knows it
    # by its cache's indexer (worker/batch/rows.py `unchecked`) and runs its sequences alone
    "qwen4_exp": "alone equal",
    "youtu_vl": "mlx-vlm fails: its processor is the hub's own code (YoutuVLProcessor), which mlx-vlm does not ship",
    # its thinker only (tests/vlms/qwen_omni.py): its image token in the thinker's config, its deepstack features
    # placed at the prompt's tokens (worker/vision_beside.py)
    "qwen3_omni_moe": "batched equal",
}
# group C (issue 61's third batch: tests/vlms/molmo.py, kimi_k.py, mage.py, zaya.py, step.py, minimax.py, muse.py,
# mimo.py, cohere.py, molmo_point.py, nemotron.py, deepseek_v4.py,
# inkling.py)
EXPECTED |= {
    "molmo2": "batched equal",  # features added at its <im_patch> places (its config's image_patch_id)
    "kimi_k25": "batched equal",
    "kimi_k3": "batched equal",  # its chat rendered by its processor's Python (no template: no kept rules)
    "mage_vl": "batched equal",
    # mlx-vlm's chunked prefill calls its language model with `inputs=`, which it names `input_ids`; onelane's answers
    # equal mlx-vlm's generate unchunked (prefill_step_size=None), its image tokens' adapters marked chunk by chunk
    "zaya1_vl": "mlx-vlm fails: its language model takes input_ids, not the inputs= its chunked prefill passes",
    "step3p7": "batched equal",
    # its get_rope_index takes image_grid_thw but never reads it (plain positions: not M-RoPE); left to count its own
    # positions, its language model keeps the last batch's rope deltas, a row each: given each row's plain positions
    "minimax_m3_vl": "batched equal",
    "muse_glimmer": "batched equal",
    "mimo_v2": "batched equal",
    "muse_spark": "mlx-vlm fails: its attention is a Metal kernel (qk_norm_rope) with no CPU path",
    "cohere_compass": "batched equal",  # M-RoPE and deepstack, as Qwen3-VL's (its features beside their mask)
    # its model keeps the last image's features and every token it decoded (its point tokens' rules): the batching
    # trial runs its sequences alone
    "molmo_point": "alone equal",
    "nemotron_h_nano_omni": "batched equal",  # Mamba-2 layers: unpadded, as Nemotron-H's text model
    # its image is a block of five ids past the vocabulary (start, pad, image, newline, end), placed where its
    # processor's image_offsets say (read as Molmo's places); but mlx-vlm reads an image prompt in one pass, its last
    # token too, not causally (its image blocks read both ways: its chunked_prefill_policy refuses to chunk it), and
    # answers from that pass: read with its last token in a step of its own, the first answer's logits are 0.12 off.
    # Its cache cannot drop the last token to read it again, and taking the first token from the prompt's pass is the
    # batch's change (worker/batch/prefill.py): refused, saying so
    "deepseek_v4": "refused",
    # its processor gives each image's patches and span as an object (ImageInput: its start in the prompt, its
    # patches, its grid, its tokens' kinds), which the image preparer cannot carry across its process: refused (read
    # without them its answers would be the text's alone). Carrying each field as an array and rebuilding the objects
    # in the worker, their starts moved to the prompt's image tokens, is the way; not done in this session's time
    "deepseek_v41": "refused",
    "inkling": "batched equal",
}
RANK = {"refused": 0, "served fails": 0, "served differs": 1, "alone equal": 2, "batched equal": 3}


def solid() -> Image.Image:
    return Image.new("RGB", (40, 40), (200, 30, 40))


def checkerboard() -> Image.Image:
    image = Image.new("RGB", (48, 32), "white")
    for x in range(0, 48, 8):
        for y in range(0, 32, 8):
            if (x + y) // 8 % 2:
                image.paste((10, 10, 10), (x, y, x + 8, y + 8))
    return image


def gradient() -> Image.Image:
    image = Image.new("RGB", (32, 56))
    image.putdata([(x * 8, y * 4, 128) for y in range(56) for x in range(32)])
    return image


#: the three questions, each about its own image, of different lengths
PROMPTS = (
    ("What is this?", solid),
    ("Describe the picture in a few words, and say which colours you see in it, please.", checkerboard),
    ("Which colours?", gradient),
)


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


@dataclass
class Outcome:
    """One architecture's row of the table."""

    arch: str
    batching: str = ""  # how its sequences share the batch ("padded", "unpadded", "alone"), once served
    served: str = ""  # "served", or why it was refused
    equal: list[bool] | None = None  # each prompt's answer equal to mlx-vlm's alone
    note: str = ""  # what differed, or why mlx-vlm fails

    @property
    def verdict(self) -> str:
        if self.served.startswith("mlx-vlm fails"):
            return self.served
        if self.served.startswith("fails"):
            return "served fails"
        if self.served != "served":
            return "refused"
        if self.equal is None or not all(self.equal):
            return "served differs"
        return "alone equal" if "alone" in self.batching else "batched equal"

    def row(self) -> str:
        equal = "" if self.equal is None else "".join("=" if e else "x" for e in self.equal)
        why = self.note if self.served in ("served", "") else self.served.removeprefix("mlx-vlm fails: ")
        verdict = "mlx-vlm fails" if self.verdict.startswith("mlx-vlm fails") else self.verdict
        return f"{self.arch:<16} {self.batching or '-':<9} {equal or '-':<5} {verdict:<16} {why[:150]}"


def reference(folder: Path) -> list[list[int]] | str:
    """mlx_vlm.generate's greedy tokens for each prompt alone (its message, the image before the question, rendered
    as mlx-vlm renders a chat's messages: `apply_chat_template`, as its server does); or why mlx-vlm cannot
    answer."""
    import mlx_vlm
    from mlx_vlm.prompt_utils import apply_chat_template

    try:
        model, processor = mlx_vlm.load(str(folder))
        answers = []
        for question, image in PROMPTS:
            content = [{"type": "image"}, {"type": "text", "text": question}]
            prompt = apply_chat_template(processor, model.config, [{"role": "user", "content": content}], num_images=1)
            out = mlx_vlm.generate(model, processor, prompt, image=[image()], max_tokens=MAX_TOKENS, temperature=0.0)
            answers.append(list(out.token_ids))
    except Exception as exc:  # mlx-vlm's own failure: the architecture is not counted against onelane
        return f"mlx-vlm fails: {type(exc).__name__}: {str(exc)[:100]}"
    return answers


def specs(arch: str) -> list[tuple[Any, dict[str, bytes]]]:
    """The three prompts as onelane's jobs hold them (a user message, its image before its words), with their
    images' bytes."""
    from tasks.job import JobSpec, Message, Picture

    found = []
    for question, image in PROMPTS:
        data = png(image())
        digest = hashlib.sha256(data).hexdigest()
        message = Message(role="user", content=question, images=(Picture(digest=digest, at=0),))
        found.append((JobSpec(owner="", model=arch, messages=(message,)), {digest: data}))
    return found


def onelane(arch: str, folder: Path) -> tuple[Outcome, list[list[int]]]:
    """The three prompts through a VisionEngine loaded as the worker loads it, inserted at once (as many as its
    batch takes; the rest as rows finish), each answer's tokens up to its end of sequence."""
    from tasks.catalogue import ModelConfig
    from worker.vision import VisionEngine

    outcome = Outcome(arch)
    try:
        engine = VisionEngine.load(ModelConfig(name=arch, path=str(folder), vision=True), 4, PREFILL_STEP)
    except Exception as exc:
        outcome.served = f"refused: {type(exc).__name__}: {exc}"
        return outcome, []
    try:
        return _answer(engine, arch, outcome)
    finally:
        engine.close()


def _answer(engine: Any, arch: str, outcome: Outcome) -> tuple[Outcome, list[list[int]]]:
    """The three prompts inserted at once into a loaded engine, after the worker's batching trial."""
    from tasks.job import SamplingParams
    from worker.batch.sharing import choose

    try:
        engine.share(choose(engine.model, engine.vocab, engine.max_kv_size, engine.prefill_step).batching)
    except Exception:  # (as the worker: a trial that fails runs the model's sequences alone)
        engine.share("alone")
    way = getattr(engine, "images", "batched")  # how its image prompts run, where the engine says
    outcome.batching = engine.batching if way == "batched" else f"{engine.batching}, images {way}"
    outcome.served = "served"
    answers: list[list[int]] = [[] for _ in PROMPTS]
    rows: dict[int, int] = {}  # the prompt of each uid
    ended: set[int] = set()
    waiting = list(range(len(PROMPTS)))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    try:
        prompts = [engine.prompt_tokens(spec, images) for spec, images in specs(arch)]
        with engine.lock:
            while len(ended) < len(prompts):
                while waiting and _joins(engine, prompts[waiting[0]], _running(rows, ended, prompts)):
                    prompt = waiting.pop(0)
                    rows[engine.insert(prompts[prompt], params)] = prompt
                for token in engine.step():
                    answers[rows[token.uid]].append(token.token)
                    if token.finish_reason is not None:
                        ended.add(rows[token.uid])
    except Exception as exc:
        outcome.served = f"fails: {type(exc).__name__}: {exc}"
        return outcome, []
    return outcome, answers


def _running(rows: dict[int, int], ended: set[int], prompts: list[list[int]]) -> list[list[int]]:
    """The prompts of the rows in the batch."""
    return [prompts[p] for p in rows.values() if p not in ended]


def _joins(engine: Any, prompt: list[int], running: list[list[int]]) -> bool:
    """Whether the worker would put `prompt` into the batch now: room in it, and neither it nor a running one a
    prompt that runs alone (`runs_alone`, where the engine has it: a model whose images go to every step)."""
    alone = getattr(engine, "runs_alone", lambda prompt: False)
    if engine.size == 0:
        return True
    return engine.size < engine.max_batch and not alone(prompt) and not any(alone(p) for p in running)


def until_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    ends = [i for i, t in enumerate(tokens) if t in eos]
    return tokens[: ends[0]] if ends else tokens


def judge(arch: str, folder: Path) -> Outcome:
    """One architecture's row: mlx-vlm's answers alone, onelane's together, compared."""
    expected = reference(folder)
    if isinstance(expected, str):
        return Outcome(arch, served=expected)
    outcome, got = onelane(arch, folder)
    if outcome.served != "served":
        return outcome
    from mlx_vlm.utils import load_config

    ends = load_config(folder).get("eos_token_id")
    eos = frozenset(ends if isinstance(ends, list) else [ends])
    outcome.equal = [until_eos(g, eos) == until_eos(e, eos) for g, e in zip(got, expected)]
    differing = [i for i, e in enumerate(outcome.equal) if not e]
    if differing:
        i = differing[0]
        outcome.note = f"prompt {i}: {until_eos(got[i], eos)} vs mlx-vlm {until_eos(expected[i], eos)}"
    return outcome


def table(outcomes: list[Outcome]) -> str:
    head = f"{'architecture':<16} {'batching':<9} {'equal':<5} {'verdict':<16} why"
    return "\n".join([head, *(o.row() for o in outcomes)])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path | str]]:
    """Every architecture's folder, built once (or why mlx-vlm cannot build it)."""
    root = tmp_path_factory.mktemp("vlms")
    folders: dict[str, Path | str] = {}
    for arch in vlms.names():
        try:
            folders[arch] = vlms.build(arch, root / arch)
        except Unbuildable as exc:
            folders[arch] = f"mlx-vlm fails: {exc}"
        except Exception as exc:
            folders[arch] = f"mlx-vlm fails: its tiny config does not build ({type(exc).__name__}: {str(exc)[:80]})"
    yield folders


def regressions(outcomes: list[Outcome]) -> list[str]:
    """What does worse than EXPECTED, has no expected outcome, or is answered by an mlx-vlm EXPECTED says fails."""
    found = []
    for o in outcomes:
        expected = EXPECTED.get(o.arch)
        if expected is None:
            found.append(f"{o.arch}: no expected outcome: add {o.arch!r}: {o.verdict!r} to EXPECTED")
        elif expected.startswith("mlx-vlm fails"):
            if not o.verdict.startswith("mlx-vlm fails"):
                found.append(f"{o.arch}: mlx-vlm answers it now ({o.verdict}): raise EXPECTED")
        elif o.verdict.startswith("mlx-vlm fails") or RANK[o.verdict] < RANK[expected]:
            found.append(f"{o.arch}: {o.verdict}, expected {expected}")
    return found


def improvements(outcomes: list[Outcome]) -> list[str]:
    """What does better than EXPECTED (it may be raised)."""
    return [
        f"{o.arch}: {o.verdict}, better than the expected {EXPECTED[o.arch]}: raise EXPECTED"
        for o in outcomes
        if o.verdict in RANK and EXPECTED.get(o.arch) in RANK and RANK[o.verdict] > RANK[EXPECTED[o.arch]]
    ]


def test_every_architecture_answers_its_image_prompts_in_the_batch_as_mlx_vlm_does_alone(corpus):
    # Given every architecture of the corpus, built
    # When each answers three image prompts of different lengths at once, and mlx-vlm each alone
    outcomes = [
        judge(arch, folder) if isinstance(folder, Path) else Outcome(arch, served=folder)
        for arch, folder in corpus.items()
    ]

    # Then none does worse than the table expects
    shown = table(outcomes)
    print("\n" + "\n".join([shown, *improvements(outcomes)]))
    worse = regressions(outcomes)
    assert not worse, "\n".join([*worse, "", shown])


@pytest.fixture
def settings(settings: Settings, corpus: dict[str, Path | str], demo_model: Path, tmp_path: Path) -> Settings:
    """A text model (the default) and Mistral 3, in one models file."""
    tables = {"chat": {"path": str(demo_model), "default": True}, "mistral3": {"path": str(corpus["mistral3"])}}
    return serve(settings.model_copy(update={"max_batch": 4, "prefill_step": PREFILL_STEP}), tmp_path, **tables)[0]


def test_a_newly_listed_family_answers_through_the_whole_stack(corpus, settings, start_worker, live_server):
    from openai import OpenAI

    from tests.test_vision import ask

    # Given Mistral 3 (newly listed) served by the worker, beside the default text model
    start_worker(settings)
    client = OpenAI(base_url=f"{live_server}/v1", api_key="unused", max_retries=0)
    expected = reference(corpus["mistral3"])
    assert not isinstance(expected, str), expected

    # When three openai SDK clients ask about their own images at once
    def ask_about(prompt: tuple[str, Any]) -> str | None:
        question, image = prompt
        answer = client.chat.completions.create(
            model="mistral3",
            messages=[{"role": "user", "content": ask(png(image()), question)}],  # type: ignore[misc, list-item]
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        return answer.choices[0].message.content

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(ask_about, PROMPTS))

    # Then each answer is mlx-vlm's own for its prompt alone
    assert answers == [_text(corpus["mistral3"], tokens) for tokens in expected]


def _text(folder: Any, tokens: list[int]) -> str:
    """Tokens written as onelane writes every model's (mlx-lm's streaming detokenizer), up to the end of sequence."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(folder)
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    for token in until_eos(tokens, frozenset(tokenizer.eos_token_ids)):
        detokenizer.add_token(token)
    detokenizer.finalize()
    return str(detokenizer.text)
