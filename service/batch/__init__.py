"""Translation without a server: texts and files in, translations out, in this process.

    from service.batch import translate

    translate("Save the file", "en", "de")        # one text: its translation
    translate(["Open", "Close"], "en", "de")      # a list: the translations, in order

As CTranslate2's ``Translator.translate_batch`` and argos-translate's ``translate`` do, the
call loads the models once per process and translates a whole list at once. What runs is
what the server runs: the models the settings name (``make serve``'s when they name none:
every export under ``build/onnx/`` and every model installed by ``python -m service models
pull``), each loaded by the server's own loader (service/wiring.py: the engine warmed up and
calibrated, its continuous batcher, its translator), and the same text pipeline (sentences,
placeholders, markup, limits of a sentence). Routes are the server's too: a direct model, or
a pivot through ``MT_PIVOT_LANG``.

There is no HTTP and no request per sentence: the texts go to the translator in chunks of
about ``CHUNK_CHARS`` characters, ``CHUNKS_IN_FLIGHT`` at a time, so the batcher's queue always
holds more sentences than a step takes and the batch is as large as the engine's cost model
lets it grow. The limits that protect a server's other clients (texts per request, characters
per text, queue length, the request deadline) do not apply: the process has no other clients.

Files (:meth:`BatchTranslator.translate_file`) go through the server's file handlers
(service/text/files.py: .txt, .po/.pot, .srt, .html, Markdown, XLIFF, office documents,
EPUB). ``python -m service translate`` (service/batch/cli.py) is the command over both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path, PurePath
from types import TracebackType
from typing import overload

from service.batch.models import batch_settings, model_specs
from service.batch.progress import Progress
from service.config import Settings, get_settings
from service.errors import InvalidInput, UnsupportedLanguage
from service.metrics import ServiceMetrics
from service.text.bulk import translate_chunks
from service.text.files import TranslatedFile, translate_file
from service.text.limits import DecodingOptions
from service.translation.discovery import serving_pairs
from service.translation.languages import LanguagePair
from service.translation.request import TranslationRequest
from service.translation.routing import Route, plan_route
from service.translation.slots import LoadedModel
from service.translation.translator import Translator

__all__ = [
    "BatchTranslator",
    "InvalidInput",
    "UnsupportedLanguage",
    "translate",
]

# A chunk of texts handed to the translator at once: enough sentences (about 100) that the
# batch stays full while earlier chunks finish, few enough that the progress bar moves.
CHUNK_CHARS = 8000
CHUNK_TEXTS = 512
# Chunks queued at once: while one waits for its longest sentence, the others feed the batch.
CHUNKS_IN_FLIGHT = 4


class BatchTranslator:
    """The installed models in this process: ``translate`` lists of texts and
    ``translate_file`` documents, any number of calls, any of the served pairs. Each model
    loads on first use; :meth:`close` (or the ``with`` block's end) stops them.

    ``settings``: the service's settings (default: the environment's, ``MT_*``);
    ``exports``: these export directories instead of what the settings name."""

    def __init__(
        self, settings: Settings | None = None, exports: Sequence[str | Path] = ()
    ) -> None:
        settings = settings or get_settings()
        if exports:
            settings = settings.replace(exports=[Path(path) for path in exports], models_dir=None)
        self.settings = batch_settings(settings)
        self.specs = model_specs(self.settings)
        self.by_pair = serving_pairs(self.specs)
        self._specs = {spec.model_id: spec for spec in self.specs}
        self._loaded: dict[str, LoadedModel] = {}
        self._runner = asyncio.Runner()
        self._metrics = ServiceMetrics()

    # --- the calls ---------------------------------------------------------------------------

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The (source, target) pairs a model translates directly."""
        return sorted(self.by_pair)

    def route(self, source: str, target: str) -> Route:
        """The models that translate ``source``→``target`` (a pivot where no model does it
        directly); ``UnsupportedLanguage`` names what is missing and what is served."""
        pair = LanguagePair.parse(source, target)
        if pair.detects or not pair.target.code:
            raise UnsupportedLanguage(
                "missing_language", "name the source and the target language (en, de, ...)"
            )
        try:
            return plan_route(pair, self.by_pair, self.settings.model.pivot_lang)
        except UnsupportedLanguage as error:
            served = ", ".join(f"{s}→{t}" for s, t in self.pairs)
            raise UnsupportedLanguage(error.code, f"{error.message} (served: {served})") from None

    @overload
    def translate(  # type: ignore[overload-overlap]  # a str is one text, not a list
        self,
        texts: str,
        source: str,
        target: str,
        *,
        beam_size: int | None = None,
        progress: bool = False,
    ) -> str: ...

    @overload
    def translate(
        self,
        texts: Sequence[str],
        source: str,
        target: str,
        *,
        beam_size: int | None = None,
        progress: bool = False,
    ) -> list[str]: ...

    def translate(
        self,
        texts: str | Sequence[str],
        source: str,
        target: str,
        *,
        beam_size: int | None = None,
        progress: bool = False,
    ) -> str | list[str]:
        """``texts`` from ``source`` into ``target`` (language codes): a list of
        translations in order, or one for one text. ``beam_size``: the server's default
        (``MT_DEFAULT_BEAM_SIZE``) when None. ``progress``: a bar on stderr."""
        route = self.route(source, target)
        options = self._options(beam_size)
        bar = Progress(progress)
        many = [texts] if isinstance(texts, str) else list(texts)
        try:
            bar.add(sum(map(len, many)))
            done = self._runner.run(self._translate_texts(many, route, options, bar))
        finally:
            bar.close()
        return done[0] if isinstance(texts, str) else done

    def translate_file(
        self,
        filename: str | Path,
        source: str,
        target: str,
        content: bytes | None = None,
        *,
        beam_size: int | None = None,
        progress: bool = False,
    ) -> TranslatedFile:
        """A document translated, its format chosen by ``filename``'s extension (the
        server's ``/translate_file`` formats); ``content``: its bytes, else read from
        ``filename``. ``UnsupportedFile`` for another format or a file its format's library
        cannot read."""
        route = self.route(source, target)
        options = self._options(beam_size)
        data = Path(filename).read_bytes() if content is None else content
        bar = Progress(progress)

        async def translate_texts(texts: list[str]) -> list[str]:
            bar.add(sum(map(len, texts)))
            return await self._translate_texts(texts, route, options, bar)

        try:
            return self._runner.run(
                translate_file(PurePath(filename).name, data, route.target, translate_texts)
            )
        finally:
            bar.close()

    def close(self) -> None:
        """Stop every loaded model's engine thread."""
        for loaded in self._loaded.values():
            loaded.batcher.begin_shutdown()
            close = getattr(loaded.batcher, "close", None)
            if close is not None:
                close()
        self._loaded.clear()
        self._runner.close()

    def __enter__(self) -> BatchTranslator:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- inside ------------------------------------------------------------------------------

    def _options(self, beam_size: int | None) -> DecodingOptions:
        # Documents' sentences are the batch's only rows: none waits behind interactive ones.
        return self.settings.limits.options(beam_size, None)

    def _translator(self, model_id: str) -> Translator:
        """The model's translator, its engine loaded and its batcher started on first use."""
        loaded = self._loaded.get(model_id)
        if loaded is None:
            from service.wiring import engine_loader, model_loader

            load = model_loader(self.settings, self._metrics, engine_loader(self.settings), None)
            loaded = load(self._specs[model_id])
            loaded.batcher.start()
            self._loaded[model_id] = loaded
        return loaded.translator

    def _legs(self, route: Route) -> list[Translator]:
        """Each leg's translator, for the leg's pair (a multilingual model serves many)."""
        return [
            self._translator(model_id).for_pair(*pair)
            for model_id, pair in zip(route.legs, route.leg_pairs, strict=True)
        ]

    async def _translate_texts(
        self, texts: list[str], route: Route, options: DecodingOptions, bar: Progress
    ) -> list[str]:
        """``texts`` through ``route`` in chunks, ``CHUNKS_IN_FLIGHT`` at a time; in order."""
        if not route.legs:  # the same language: nothing to translate
            bar.advance(sum(map(len, texts)))
            return list(texts)
        first, *rest = self._legs(route)
        pair = LanguagePair.of(route.source, route.target)

        async def translate_chunk(chunk: list[str]) -> list[str]:
            request = TranslationRequest(chunk, pair, options)
            items = await first.translate(request, None, then=rest[0] if rest else None)
            done: list[str] = []
            async for item in items:
                translations = getattr(item, "translations", None)
                if translations is not None:
                    done = [translation.text for translation in translations]
            bar.advance(sum(map(len, chunk)))
            return done

        return await translate_chunks(_chunks(texts), translate_chunk, CHUNKS_IN_FLIGHT)


def _chunks(texts: Sequence[str]) -> list[list[str]]:
    """``texts`` cut into runs of at most ``CHUNK_TEXTS`` texts and about ``CHUNK_CHARS``
    characters (a longer text is a chunk of its own)."""
    chunks: list[list[str]] = []
    current: list[str] = []
    size = 0
    for text in texts:
        if current and (size + len(text) > CHUNK_CHARS or len(current) >= CHUNK_TEXTS):
            chunks.append(current)
            current, size = [], 0
        current.append(text)
        size += len(text)
    if current:
        chunks.append(current)
    return chunks


_shared: BatchTranslator | None = None


@overload
def translate(  # type: ignore[overload-overlap]  # a str is one text, not a list
    texts: str, source: str, target: str, *, beam_size: int | None = None, progress: bool = False
) -> str: ...


@overload
def translate(
    texts: Sequence[str],
    source: str,
    target: str,
    *,
    beam_size: int | None = None,
    progress: bool = False,
) -> list[str]: ...


def translate(
    texts: str | Sequence[str],
    source: str,
    target: str,
    *,
    beam_size: int | None = None,
    progress: bool = False,
) -> str | list[str]:
    """``texts`` (one text or a list) from ``source`` into ``target`` with the installed
    models, loaded once per process (:class:`BatchTranslator` over the environment's
    settings). ``UnsupportedLanguage`` for a pair no model serves."""
    global _shared
    if _shared is None:
        _shared = BatchTranslator()
    return _shared.translate(texts, source, target, beam_size=beam_size, progress=progress)
