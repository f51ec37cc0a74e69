"""Train the joint SentencePiece tokenizer of the default model, in the Marian layout.

Usage::

    python -m models.training.tokenizer --corpus build/corpus \\
        --out build/corpus/tokenizer --vocab-size 8000

One unigram model is trained on both sides of ``train.tsv`` (placeholders masked with
``service.text.placeholders.mask_pair``, the ``｟k｠`` symbols reserved as
``user_defined_symbols`` so each stays one piece). It is written in the Hugging Face Marian
(OPUS-MT) tokenizer layout, so the runtime has one tokenizer code path for our model and for
imported OPUS-MT checkpoints:

* ``source.spm``, ``target.spm`` — the same SentencePiece model twice (joint vocabulary);
* ``vocab.json`` — piece → model id;
* ``tokenizer_config.json``, ``special_tokens_map.json`` — as ``MarianTokenizer`` saves them.

Id convention (Marian's): ``</s>`` = 0 (eos), ``<unk>`` = 1, then the pieces (the reserved
placeholder symbols first, at ids 2 … 2+MAX_PLACEHOLDERS-1), and ``<pad>`` = the last id,
``vocab_size - 1``. ``<pad>`` is also the decoder start token, as in Marian. There is no
``<s>``. For our model the SentencePiece ids equal the ``vocab.json`` ids (the trainer is
told where eos/unk/pad go); for imported OPUS-MT models they do not, which is why the
runtime always maps pieces through ``vocab.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece as spm

from models.training.corpus import Pair, read_tsv
from service.text.placeholders import PLACEHOLDER_SYMBOLS, mask_pair

EOS_TOKEN, UNK_TOKEN, PAD_TOKEN = "</s>", "<unk>", "<pad>"
EOS_ID, UNK_ID = 0, 1
DEFAULT_VOCAB_SIZE = 8000
MODEL_MAX_LENGTH = 512


def masked_texts(pairs: Iterable[Pair]) -> Iterator[str]:
    """Both sides of every pair, placeholders masked as they will be at training time."""
    for pair in pairs:
        source, target, _ = mask_pair(pair.source, pair.target)
        yield source
        yield target


def train_sentencepiece(
    sentences: Iterable[str], vocab_size: int, num_threads: int = 2
) -> spm.SentencePieceProcessor:
    """Train a unigram model in memory with Marian's special ids; return it loaded.

    ``vocab_size`` counts every id, ``<pad>`` included, so it is the model's embedding size.
    """
    model_bytes = io.BytesIO()
    try:
        _train_into(model_bytes, sentences, vocab_size, num_threads)
    except RuntimeError as error:
        # SentencePiece only says "pieces_size() - 1 == pad_id" when the text cannot fill
        # the vocabulary, because <pad> must land on the last id.
        raise ValueError(
            f"could not train {vocab_size} pieces with <pad> last: is the corpus too small "
            f"for --vocab-size {vocab_size}? ({error})"
        ) from error
    return spm.SentencePieceProcessor(model_proto=model_bytes.getvalue())


def _train_into(
    model_bytes: io.BytesIO, sentences: Iterable[str], vocab_size: int, num_threads: int
) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model_bytes,
        model_type="unigram",
        vocab_size=vocab_size,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        pad_id=vocab_size - 1,
        eos_piece=EOS_TOKEN,
        unk_piece=UNK_TOKEN,
        pad_piece=PAD_TOKEN,
        user_defined_symbols=list(PLACEHOLDER_SYMBOLS),
        # Catalog text has stray symbols (math, arrows, CJK in examples); don't spend
        # vocabulary on characters seen a handful of times.
        character_coverage=0.9999,
        input_sentence_size=2_000_000,
        shuffle_input_sentence=True,
        num_threads=num_threads,
        minloglevel=2,
    )


def marian_vocab(processor: spm.SentencePieceProcessor) -> dict[str, int]:
    """``vocab.json`` content: every piece at its SentencePiece id (they coincide here)."""
    vocab = {
        processor.id_to_piece(piece_id): piece_id for piece_id in range(processor.get_piece_size())
    }
    if vocab[EOS_TOKEN] != EOS_ID or vocab[UNK_TOKEN] != UNK_ID:
        raise ValueError("SentencePiece model does not follow the Marian id convention")
    if vocab[PAD_TOKEN] != len(vocab) - 1:
        raise ValueError("<pad> must be the last id")
    return vocab


def write_marian_layout(
    processor: spm.SentencePieceProcessor,
    out_dir: Path,
    source_lang: str = "en",
    target_lang: str = "de",
) -> None:
    """Write ``processor`` as a directory ``transformers.MarianTokenizer`` can load."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model_bytes = processor.serialized_model_proto()
    (out_dir / "source.spm").write_bytes(model_bytes)
    (out_dir / "target.spm").write_bytes(model_bytes)
    vocab = marian_vocab(processor)
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1) + "\n")
    special_tokens = {"eos_token": EOS_TOKEN, "unk_token": UNK_TOKEN, "pad_token": PAD_TOKEN}
    config = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": source_lang,
        "target_lang": target_lang,
        "separate_vocabs": False,
        "model_max_length": MODEL_MAX_LENGTH,
        **special_tokens,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_tokens, indent=2) + "\n")


def tokenizer_statistics(processor: spm.SentencePieceProcessor, pairs: list[Pair]) -> dict:
    """Tokens per sentence (masked, without eos) and unknown-piece rate on ``pairs``
    (``{}`` when there are none: a corpus built without the catalogs has no ``valid``)."""
    if not pairs:
        return {}
    sources, targets = [], []
    for pair in pairs:
        source, target, _ = mask_pair(pair.source, pair.target)
        sources.append(source)
        targets.append(target)
    source_ids = processor.encode(sources)
    target_ids = processor.encode(targets)
    all_ids = [piece_id for ids in source_ids + target_ids for piece_id in ids]
    symbol_ids = [processor.piece_to_id(symbol) for symbol in PLACEHOLDER_SYMBOLS]
    return {
        "sentences": len(pairs),
        "source_tokens_mean": round(sum(map(len, source_ids)) / len(pairs), 2),
        "target_tokens_mean": round(sum(map(len, target_ids)) / len(pairs), 2),
        "source_tokens_max": max(map(len, source_ids)),
        "target_tokens_max": max(map(len, target_ids)),
        "source_chars_per_token": round(
            sum(map(len, sources)) / max(1, sum(map(len, source_ids))), 2
        ),
        "unk_rate": round(all_ids.count(UNK_ID) / max(1, len(all_ids)), 5),
        "placeholder_symbols_are_single_pieces": all(
            processor.encode(symbol, out_type=int)[-1:] == [symbol_id]
            for symbol, symbol_id in zip(PLACEHOLDER_SYMBOLS, symbol_ids, strict=True)
        ),
    }


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("build/corpus"))
    parser.add_argument("--out", type=Path, default=Path("build/corpus/tokenizer"))
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="de")
    args = parser.parse_args(argv)

    train_pairs = read_tsv(args.corpus / "train.tsv")
    processor = train_sentencepiece(masked_texts(train_pairs), args.vocab_size)
    write_marian_layout(processor, args.out, args.source_lang, args.target_lang)
    stats = {
        "vocab_size": processor.get_piece_size(),
        "train": tokenizer_statistics(processor, train_pairs),
        "valid": tokenizer_statistics(processor, read_tsv(args.corpus / "valid.tsv")),
    }
    if (args.corpus / "valid-prose.tsv").exists():
        stats["valid-prose"] = tokenizer_statistics(
            processor, read_tsv(args.corpus / "valid-prose.tsv")
        )
    (args.out / "tokenizer_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    json.dump(stats, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
