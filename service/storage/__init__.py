"""The service's store: what outlives a request (glossaries, translation memories, document
jobs, usage counts, rate-limit windows), in SQLite files under ``MT_DATA_DIR`` or one
PostgreSQL database every replica shares (``MT_DATABASE_URL``).

``database`` is the interface, ``session`` the SQL both back-ends run, ``migrations`` the
versioned schema, ``sqlite`` and ``postgres`` the back-ends, ``databases`` the choice between
them; ``glossaries``, ``memories`` and ``documents`` (with ``document_claims``) are the stores that
``translation/`` and ``web/`` use, and ``owners`` says whose rows a client sees.
"""
