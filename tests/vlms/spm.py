"""A tiny SentencePiece tokenizer, for the families whose processor reads tokenizer.model (ERNIE 4.5 VL's, ...) where
the corpus's others read the demo tokenizer's tokenizer.json: a unigram model of the printable ASCII characters and a
few words, with byte fallback (every text encodes), its special tokens whole pieces, written both as tokenizer.model
(what the family's own slow tokenizer loads) and as the tokenizer.json it converts to (what mlx-lm's tokenizer, and
so the worker, loads: the same ids for every text, its decoder SentencePiece's)."""

from __future__ import annotations

import string
from pathlib import Path

#: the pieces every such tokenizer starts with: unknown, BOS, EOS
UNK, BOS, EOS = "<unk>", "<s>", "</s>"
WORDS = ["\u2581the", "\u2581is", "\u2581this", "\u2581a", "\u2581of", "\u2581in", "\u2581picture", "\u2581colours"]


def write_spm(folder: Path, specials: list[str], fast: bool = True) -> dict[str, int]:
    """Write tokenizer.model (and tokenizer.json if `fast`: else any left there is removed) into `folder`: <unk> 0,
    <s> 1, </s> 2, then `specials` (whole pieces), the 256 byte pieces, then the characters and words; returns every
    special piece's id."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    kind = pb.ModelProto.SentencePiece.Type
    spm = pb.ModelProto()
    pieces = [(UNK, kind.UNKNOWN, 0.0), (BOS, kind.CONTROL, 0.0), (EOS, kind.CONTROL, 0.0)]
    pieces += [(s, kind.USER_DEFINED, 0.0) for s in specials]
    pieces += [(f"<0x{b:02X}>", kind.BYTE, 0.0) for b in range(256)]
    characters = ["\u2581", *(c for c in string.printable if not c.isspace())]
    pieces += [(c, kind.NORMAL, -1.0 - i / 100) for i, c in enumerate(characters)]
    pieces += [(w, kind.NORMAL, -0.5) for w in WORDS]
    for piece, type_, score in pieces:
        spm.pieces.add(piece=piece, type=type_, score=score)
    spm.trainer_spec.model_type = pb.TrainerSpec.UNIGRAM
    spm.trainer_spec.vocab_size = len(pieces)
    spm.trainer_spec.byte_fallback = True
    spm.trainer_spec.unk_id, spm.trainer_spec.bos_id, spm.trainer_spec.eos_id, spm.trainer_spec.pad_id = 0, 1, 2, -1
    spm.normalizer_spec.name = "identity"
    spm.normalizer_spec.add_dummy_prefix = False
    spm.normalizer_spec.remove_extra_whitespaces = False
    spm.normalizer_spec.escape_whitespaces = True
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(spm.SerializeToString())
    ids = {p: i for i, (p, t, _) in enumerate(pieces) if t != kind.NORMAL and t != kind.BYTE}
    if not fast:
        (folder / "tokenizer.json").unlink(missing_ok=True)
        return ids

    fast = Tokenizer(models.Unigram([(p, s) for p, _, s in pieces], unk_id=0, byte_fallback=True))
    fast.normalizer = normalizers.Replace(" ", "\u2581")
    fast.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    whole = [p for p, t, _ in pieces if t in (kind.UNKNOWN, kind.CONTROL, kind.USER_DEFINED)]
    fast.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in whole])
    fast.save(str(folder / "tokenizer.json"))
    return ids


def vocab_size(specials: list[str]) -> int:
    """How many pieces write_spm writes for these specials."""
    return 3 + len(specials) + 256 + sum(1 for c in string.printable if not c.isspace()) + 1 + len(WORDS)


def write_spm_tokenizer(
    folder: Path, specials: list[str], settings: dict[str, object], template: str, fast: bool = True
) -> dict[str, int]:
    """write_spm's tokenizer (tokenizer.json too if `fast`), with `settings` (named tokens, class, ...) as its tokenizer_config.json and the chat
    template there and in chat_template.json (over what write_folder wrote for the demo tokenizer); returns the
    special pieces' ids."""
    from tests.tiny_kinds import write_json
    from tests.tiny_vision import MAX_LENGTH

    ids = write_spm(folder, specials, fast)
    config = dict(settings, model_max_length=MAX_LENGTH, chat_template=template)
    write_json(folder / "tokenizer_config.json", config)
    write_json(folder / "chat_template.json", {"chat_template": template})
    return ids
