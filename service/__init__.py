"""mtserve: machine translation on ONNX Runtime with continuous batching.

Layers, lowest first (imports only point down; tests/test_architecture.py checks it):
``errors`` and ``metrics`` (shared vocabulary), ``runtime/`` (ONNX sessions, KV caches,
search, engine), ``scheduling/`` (the continuous batcher), ``text/`` (tokenizer, sentences,
protected spans, documents), ``storage/`` (the store: SQLite or PostgreSQL, migrations,
glossaries, memories, document jobs), ``translation/`` (translator, models, routing, detection),
``web/`` (FastAPI), with ``config`` (settings) and ``wiring`` (the composition root) above.
docs/architecture.md walks a request through them.
"""
